import json

import pytest

from hvdkit.config import Config, parse_config
from hvdkit.errors import UsageError


def test_defaults():
    c = parse_config([], env={})
    assert c == Config()
    assert c.strategy == "horovod" and c.dataset == "digits"


def test_precedence_flag_over_file_over_env_over_default(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"batch_size": 16, "epochs": 7}))
    env = {"HVDKIT_BATCH_SIZE": "8", "HVDKIT_EPOCHS": "3", "HVDKIT_LR": "0.5"}
    c = parse_config(["--config", str(f), "--epochs", "9"], env=env)
    assert c.epochs == 9          # flag beats file and env
    assert c.batch_size == 16     # file beats env
    assert c.lr == 0.5            # env beats default
    assert c.momentum == 0.9      # default


def test_bool_flags_and_env():
    assert parse_config(["--no-lr-scaling"], env={}).lr_scaling is False
    assert parse_config([], env={"HVDKIT_LR_SCALING": "false"}).lr_scaling is False
    with pytest.raises(UsageError, match="not a boolean"):
        parse_config([], env={"HVDKIT_LR_SCALING": "maybe"})


@pytest.mark.parametrize("argv,match", [
    (["--batch-size", "0"], "--batch-size=0 must be > 0"),
    (["--batch-size", "-3"], "must be > 0"),
    (["--batch-size", "x"], "not a valid int"),
    (["--epochs", "0"], "--epochs=0"),
    (["--eval-fraction", "1.5"], "eval-fraction"),
    (["--fail-at", "1"], "RANK:STEP"),
    (["--resume"], "--output-dir"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--optimizer", "rmsprop"], "invalid choice"),
])
def test_bad_values_are_refused_with_the_value_named(argv, match):
    with pytest.raises(UsageError, match=match):
        parse_config(argv, env={})


def test_unknown_keys_are_refused(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"batchsize": 16}))
    with pytest.raises(UsageError, match="unknown key 'batchsize'"):
        parse_config(["--config", str(f)], env={})
    with pytest.raises(UsageError, match="HVDKIT_BATCHSIZE"):
        parse_config([], env={"HVDKIT_BATCHSIZE": "4"})
    f.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        parse_config(["--config", str(f)], env={})


def test_to_dict_roundtrips_through_a_config_file(tmp_path):
    c = parse_config(["--model", "cnn", "--lr", "0.1"], env={})
    d = c.to_dict()
    d.pop("extra")
    f = tmp_path / "c.json"
    f.write_text(json.dumps(d))
    assert parse_config(["--config", str(f)], env={}) == c


def test_unreadable_config_files_are_one_line(tmp_path):
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path, match in ((tmp_path, "cannot read it"), (binary, "not a text file")):
        with pytest.raises(UsageError, match=match):
            parse_config(["--config", str(path)], env={})


@pytest.mark.parametrize("argv,message", [
    (["--fusion-bytes", "-1"], "--fusion-bytes=-1 must be >= 0"),
    (["--staleness", "-1"], "--staleness=-1 must be >= 0"),
    (["--dc-lambda", "-0.1"], "--dc-lambda=-0.1 must be >= 0"),
    (["--num-servers", "0"], "--num-servers=0 must be >= 1"),
    (["--micro-batches", "0"], "--micro-batches=0 must be >= 1"),
    (["--ps-timeout", "0"], "--ps-timeout=0.0 must be > 0"),
])
def test_every_strategy_option_is_checked_when_the_flags_are_parsed(argv, message):
    """Declared once (hvdkit.config.Option in each strategy's ``options``), refused at parse time."""
    from hvdkit.strategies import extra_fields, summaries

    with pytest.raises(UsageError) as e:
        parse_config(["--strategy", "ring", *argv], env={}, extra_fields=extra_fields(), strategies=summaries())
    assert str(e.value) == message


def test_every_strategy_is_registered_under_its_own_name_and_listed_in_help():
    from hvdkit.config import build_parser
    from hvdkit.strategies import STRATEGIES, extra_fields, summaries

    assert all(cls.name == name and cls.summary for name, cls in STRATEGIES.items())
    text = build_parser(extra_fields=extra_fields(), strategies=summaries()).format_help()
    assert all(f"  {name} " in text for name in STRATEGIES)
    assert len({f.name for f in extra_fields()}) == len(extra_fields()), "an option declared twice"


def test_out_dir_is_the_same_setting_as_output_dir():
    """``--out-dir`` (the benchmarks' and the launcher's name) is an alias of train's ``--output-dir``: one
    setting, one dest, the same in every command (issue 26: the same option has the same name)."""
    from hvdkit.config import parse_config
    assert parse_config(["--out-dir", "d1"]).output_dir == "d1"
    assert parse_config(["--output-dir", "d2"]).output_dir == "d2"
