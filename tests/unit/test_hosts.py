"""The one hostfile / ``-H`` reader (hvdkit.launch.hosts), the form each launcher gets, the
elastic discovery output, and the refusals (file, line number, text; status 2)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from hvdkit.errors import UsageError
from hvdkit.launch import cli
from hvdkit.launch.elastic import discovered, slots_of
from hvdkit.launch.hosts import (Host, check_launcher, hostfile_text, hosts_arg, parse_hostfile, parse_hosts,
                                 total_slots, write_hostfile)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: every form people write (Horovod#1428, DeepSpeed#669, ompi#11136) in one file
MESSY = """\
# the job's hosts

n1.example.org slots = 2   # FQDN, spaces around '='
10.0.0.7 slots=4 max_slots=8
alice@n3 slots=1
n4
n4          # listed once per slot: Open MPI counts 2
n5:3
n4 slots=2  # a slot count on a host listed before: adds up (Open MPI refuses this mix)
"""


def _triples(hosts):
    return [(h.user, h.name, h.slots) for h in hosts]


def test_every_form_in_one_file():
    hosts = parse_hostfile(MESSY, "hosts")
    assert _triples(hosts) == [("", "n1.example.org", 2), ("", "10.0.0.7", 4), ("alice", "n3", 1), ("", "n4", 4),
                               ("", "n5", 3)]
    assert hosts[1].max_slots == 8 and hosts[0].where == "hosts:3" and hosts[3].where == "hosts:6"
    assert total_slots(hosts) == 14


@pytest.mark.parametrize("text,expected", [
    ("localhost\nlocalhost\n", [("localhost", 2)]),                       # once per slot
    ("localhost slots=1\nlocalhost slots=1\n", [("localhost", 2)]),       # what Open MPI refuses
    ("a\nb\na\n", [("a", 2), ("b", None)]),                                  # order of first appearance
    ("a\n", [("a", None)]),                                               # once, no count: the launcher's default
    ("a max-slots=3 slots=2\n", [("a", 2)]),
    ("\t a   slots=2\t# tab\n\n   \n#x\n", [("a", 2)]),
    ("a slots=2 # slots=9\n", [("a", 2)]),                                # a comment is not read
])
def test_counts(text, expected):
    assert [(h.name, h.slots) for h in parse_hostfile(text)] == expected


@pytest.mark.parametrize("text,match", [
    ("a slots=0\n", r"^h:1: 'a slots=0': slots='0' must be a positive integer$"),
    ("# c\n\na slots=2\nb slotz=2  # typo\n", r"^h:4: 'b slotz=2  # typo': 'slotz=2' is not slots=N or max_slots=N"),
    ("a slots=2\nb cores=4\n", r"^h:2: 'b cores=4': 'cores=4' is not slots=N"),
    ("a slots=2 slots=3\n", r"^h:1: .*two slot counts"),
    ("a slots=4 max_slots=2\n", r"^h:1: host 'a': max_slots=2 is less than slots=4"),
    ("a slots=2 max_slots=4\na\n", r"^h:2: 'a': max_slots on a host listed more than once"),
    ("::1 slots=2\n", r"^h:1: '::1 slots=2': IPv6 literal '::1'"),
    ("a\nfe80::1:2\n", r"^h:2: 'fe80::1:2': IPv6 literal"),
    ("node_1 slots=2\n", r"^h:1: .*host name 'node_1': use letters, digits"),
    ("a slots=2\nbob@a slots=1\n", r"^h:2: .*given as user 'bob' here and '\(none\)' at h:1"),
    ("b@d@n slots=1\n", r"is not a user name"),
    ("# nothing\n\n", r"^h: no hosts in the hostfile"),
])
def test_refusals_name_file_line_and_text(text, match):
    with pytest.raises(UsageError, match=match):
        parse_hostfile(text, "h")


def test_hosts_flag():
    assert _triples(parse_hosts("a:4,b:4,c")) == [("", "a", 4), ("", "b", 4), ("", "c", None)]
    assert _triples(parse_hosts("root@localhost:2")) == [("root", "localhost", 2)]
    assert _triples(parse_hosts("a,a,b:2,a:2")) == [("", "a", 4), ("", "b", 2)]
    for spec, match in [("a:0", "positive integer"), ("a:x", "positive integer"), (",a:1", "empty host name"),
                        ("::1", "IPv6 literal"), ("[::1]:2", "IPv6 literal"), (":2", "empty host name"),
                        ("a_b:2", "host name 'a_b'")]:
        with pytest.raises(UsageError, match=match):
            parse_hosts(spec)


def test_launcher_forms():
    hosts = parse_hostfile(MESSY)
    assert hosts_arg(hosts) == "n1.example.org:2,10.0.0.7:4,n3:1,n4:4,n5:3"
    assert hostfile_text(hosts, "openmpi") == ("n1.example.org slots=2\n10.0.0.7 slots=4 max_slots=8\n"
                                               "alice@n3 slots=1\nn4 slots=4\nn5 slots=3\n")
    assert hostfile_text(parse_hostfile("a\nb slots=2\n"), "openmpi") == "a\nb slots=2\n"   # a: Open MPI's default
    assert hostfile_text(parse_hostfile("a\nb slots=2\n"), "mpich") == "a\nb:2\n"
    # horovodrun: a user equal to the one launching is dropped, another refused; every host needs a count
    assert _triples(check_launcher(parse_hosts("root@x:2"), "horovodrun", "openmpi", user="root")) == [("", "x", 2)]
    with pytest.raises(UsageError, match=r"^-H 'bob@x:2': bob@x: horovodrun takes no user@.*~/.ssh/config"):
        check_launcher(parse_hosts("bob@x:2"), "horovodrun", "openmpi", user="root")
    with pytest.raises(UsageError, match=r"^f:2: host 'b' has no slot count; horovodrun needs one"):
        check_launcher(parse_hostfile("a slots=1\nb\n", "f"), "horovodrun", "openmpi")
    with pytest.raises(UsageError, match=r"^f:5: alice@n3: MPICH's mpiexec takes no user@"):
        check_launcher(parse_hostfile(MESSY, "f"), "mpi", "mpich")
    assert check_launcher(parse_hostfile(MESSY), "mpi", "openmpi") == parse_hostfile(MESSY)


def test_write_hostfile_is_named_after_its_content(tmp_path):
    hosts = [Host("a", 2), Host("b", None, "bob")]
    p1 = write_hostfile(hosts, "openmpi", str(tmp_path))
    assert write_hostfile(hosts, "openmpi", str(tmp_path)) == p1
    assert write_hostfile(hosts[:1], "openmpi", str(tmp_path)) != p1
    with open(p1) as f:
        assert f.read().splitlines()[1:] == ["a slots=2", "bob@b"]


def _dry(*argv, env=None):
    """hvdkit-launch --dry-run in a subprocess: (status, stdout, stderr)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(env or {}, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "hvdkit.launch", "--dry-run", "--mpi", "openmpi", *argv],
                       capture_output=True, text=True, env=e, timeout=60, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def test_dry_run_hands_each_launcher_its_form(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# two slots, one line each\n\nlocalhost   # first\nlocalhost slots = 1\n")
    rc, out, err = _dry("-np", "2", "--hostfile", str(f), "--launcher", "horovodrun", "--", "prog")
    assert rc == 0, err
    assert re.search(r"horovodrun -np 2 -H localhost:2 .*prog$", out.strip())
    rc, out, err = _dry("-np", "2", "--hostfile", str(f), "--mpi-exec", "mpirun", "--", "prog")
    argv = shlex.split(out)
    written = argv[argv.index("--hostfile") + 1]
    assert rc == 0 and written != str(f) and open(written).read().splitlines()[1:] == ["localhost slots=2"]
    # user@ in -H: horovodrun drops this user; Open MPI's -H refuses '@', so it gets a hostfile
    me = __import__("getpass").getuser()
    rc, out, _ = _dry("-np", "2", "-H", f"{me}@localhost:2", "--launcher", "horovodrun", "--", "prog")
    assert rc == 0 and " -H localhost:2 " in out
    rc, out, _ = _dry("-np", "2", "-H", f"{me}@localhost:2", "--mpi-exec", "mpirun", "--", "prog")
    argv = shlex.split(out)
    assert "-H" not in argv and open(argv[argv.index("--hostfile") + 1]).read().splitlines()[1:] == [
        f"{me}@localhost slots=2"]


def test_dry_run_refusal_is_one_line_status_2(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# hosts\nh1 slots=2\nh2 slots = two\n")
    rc, out, err = _dry("-np", "2", "--hostfile", str(f), "--", "prog")
    assert (rc, out) == (2, "")
    assert err == f"hvdkit-launch: error: {f}:3: 'h2 slots = two': slots='two' must be a positive integer\n"
    rc, _, err = _dry("-np", "2", "-H", "someone-else@h1:2", "--launcher", "horovodrun", "--", "prog")
    assert rc == 2 and err.count("\n") == 1 and "horovodrun takes no user@" in err


def test_elastic_discovery_prints_each_host_once_with_its_slots(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# elastic\nlocalhost\nlocalhost   # 2 slots\nh2 slots = 2\nh3\n")
    assert discovered(str(f)) == ["localhost:2", "h2:2", "h3:1"]
    assert slots_of(str(f)) == 5
    f.write_text("h1 slots=2\nh2 slotz=2\n")
    with pytest.raises(UsageError, match=r"hosts:2: 'h2 slotz=2'"):
        discovered(str(f))
