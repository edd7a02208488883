"""The emulated cluster's pure parts: rates, durations, topologies, addresses, the /etc/hosts block."""
import pytest

from hvdkit.cluster import names
from hvdkit.cluster.spec import ClusterSpec, format_rate, parse_duration, parse_rate, parse_topology, plan
from hvdkit.errors import UsageError


@pytest.mark.parametrize("text, bps", [("1gbit", 10**9), ("200mbit", 2 * 10**8), ("1.5Gbit", 1_500_000_000),
                                       ("64kbit", 64_000), (" 100 mbit ", 10**8)])
def test_rates_in_tc_units(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["1000", "1gb", "fast", "-1gbit", "1kbit", ""])
def test_bad_rates_say_how_to_write_one(text):
    with pytest.raises(UsageError, match="rate"):
        parse_rate(text)


def test_format_rate_round_trips():
    for text in ("1gbit", "200mbit", "64kbit", "25gbit"):
        assert format_rate(parse_rate(text)) == text


def test_durations():
    assert parse_duration("5ms") == pytest.approx(0.005)
    assert parse_duration("500us") == pytest.approx(5e-4)
    with pytest.raises(UsageError, match="duration"):
        parse_duration("5")


def test_topologies():
    assert parse_topology("star") == ("star", 1)
    assert parse_topology("racks:3") == ("racks", 3)
    for bad in ("ring", "racks:0", "racks:x"):
        with pytest.raises(UsageError, match="--topology"):
            parse_topology(bad)


def test_plan_names_addresses_and_racks():
    hosts = plan(ClusterSpec(hosts=4, slots=2, topology="racks", racks=2, uplink_bps=10**8))
    assert [h.name for h in hosts] == ["h1", "h2", "h3", "h4"]
    assert [h.address for h in hosts] == [f"198.18.0.{i}" for i in (1, 2, 3, 4)]
    assert [h.rack for h in hosts] == [1, 1, 2, 2]
    assert {h.slots for h in hosts} == {2}
    assert hosts[0].netns == "hvdc-h1"
    assert [h.rack for h in plan(ClusterSpec(hosts=4, topology="racks", racks=3, uplink_bps=10**8))] == [1, 1, 2, 3]
    assert all(h.address.startswith("198.18.") for h in plan(ClusterSpec(hosts=200)))   # the benchmarking block


@pytest.mark.parametrize("spec, message", [
    (ClusterSpec(hosts=0), "--hosts"), (ClusterSpec(hosts=201), "--hosts"), (ClusterSpec(slots=0), "--slots"),
    (ClusterSpec(topology="racks", racks=2), "--uplink"), (ClusterSpec(uplink_bps=10**8), "--uplink"),
    (ClusterSpec(hosts=2, topology="racks", racks=3, uplink_bps=10**8), "one rack per host"),
    (ClusterSpec(delay_s=-1.0), "--delay"), (ClusterSpec(hostname="no_underscores"), "--hostname"),
    (ClusterSpec(hostname="-x"), "--hostname"), (ClusterSpec(isolated_interface="eth0"), "--isolated-interface"),
    (ClusterSpec(isolated_interface="a-very-long-name"), "--isolated-interface")])
def test_bad_specs_name_the_option(spec, message):
    with pytest.raises(UsageError, match=message):
        spec.check()


def test_hosts_block_is_added_replaced_and_removed_alone(tmp_path):
    f = tmp_path / "hosts"
    original = "127.0.0.1 localhost\n127.0.1.1 vm\n# a comment h1\n"
    f.write_text(original)
    names.write(plan(ClusterSpec(hosts=2)), path=str(f))
    assert "198.18.0.1\th1\n198.18.0.2\th2\n" in f.read_text()
    names.write(plan(ClusterSpec(hosts=3)), path=str(f))            # replaced, not appended twice
    text = f.read_text()
    assert text.count(names.BEGIN) == 1 and "198.18.0.3\th3" in text and text.startswith(original)
    assert names.remove(path=str(f)) is True
    assert f.read_text() == original
    assert names.remove(path=str(f)) is False


def test_hosts_block_refuses_names_already_taken(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("10.0.0.7 h2 h2.example\n")
    with pytest.raises(UsageError, match="already defines h2"):
        names.write(plan(ClusterSpec(hosts=2)), path=str(f))
    assert f.read_text() == "10.0.0.7 h2 h2.example\n"


def test_hostnames_and_own_hosts_files(tmp_path, monkeypatch):
    """--hostname gives every host one name; --hostname-loopback writes each host a hosts file of its
    own (mounted by ip netns exec) mapping that name to 127.0.1.1; remove() deletes those files too."""
    from hvdkit.cluster import names
    h1, h2 = plan(ClusterSpec(hosts=2))
    assert [ClusterSpec(hostname="node").hostname_of(h) for h in (h1, h2)] == ["node", "node"]
    assert [ClusterSpec().hostname_of(h) for h in (h1, h2)] == ["h1", "h2"]
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    monkeypatch.setattr(names, "NETNS_ETC", str(tmp_path / "netns"))
    names.write([h1, h2], path=str(hosts))
    own = names.write_own(h2, "node", path=str(hosts))
    assert own == str(tmp_path / "netns" / "hvdc-h2" / "hosts")
    lines = open(own).read().splitlines()
    assert "198.18.0.1\th1" in lines and lines[-1].startswith("127.0.1.1\tnode\t#"), lines
    assert names.remove(str(hosts)) and not (tmp_path / "netns" / "hvdc-h2").exists()
    assert hosts.read_text() == "127.0.0.1 localhost\n"
