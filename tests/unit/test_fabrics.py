"""Open MPI's cm PML left out where no host has a fabric (hvdkit/launch/fabrics.py): pure, no MPI job.

The launches that apply the rule are checked where they are built: hvdkit-launch
(tests/unit/test_launch_network.py), local_command (tests/unit/test_launch.py), hvdkit-bench's
multi-host places (tests/unit/test_places.py).
"""
from __future__ import annotations

from hvdkit.launch.fabrics import fabric_devices, file_params, param_files, skip_cm_args, user_chose_pml

#: Debian's /etc/openmpi/openmpi-mca-params.conf (Open MPI 4.1.4, this machine kind), its settings
DEBIAN = "btl_base_warn_component_unused=0\nmtl = ^ofi\nbtl = ^uct,openib,ofi\npml = ^ucx\nosc = ^ucx,pt2pt\n"


def test_the_devices_of_the_fabrics_are_found_under_a_root(tmp_path):
    assert fabric_devices(str(tmp_path)) == []
    for dev in ("sys/class/infiniband/efa_0", "dev/hfi1_0", "dev/cxi0", "dev/eth0", "dev/null"):
        (tmp_path / dev).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / dev).touch()
    assert fabric_devices(str(tmp_path)) == [str(tmp_path / d) for d in ("dev/cxi0", "dev/hfi1_0",
                                                                         "sys/class/infiniband/efa_0")]


def test_only_known_devices_and_no_user_choice_leave_cm_out():
    none = [[], []]
    assert skip_cm_args(("-v",), {}, none, files=[]) == ("-v", "--mca", "pml", "^cm")
    assert skip_cm_args(("-v",), {}, None, files=[]) == ("-v",)   # the hosts' devices not read
    assert skip_cm_args(("-v",), {}, [[], ["/dev/hfi1_0"]], files=[]) == ("-v",)   # one host has a fabric
    assert skip_cm_args((), {}, iter([[]]), files=[]) == ("--mca", "pml", "^cm")   # any iterable of hosts


def test_every_form_of_a_users_choice_is_kept():
    chosen = [("-mca", "pml", "ucx"), ("--mca", "mtl", "psm2"), ("--gmca", "pml", "ob1"), ("-gmca", "mtl", "ofi"),
              ("--mca", "mtl_ofi_provider_include", "psm3"), ("--mca", "pml_cm_free_list_num", "8"),
              ("--tune", "f.conf"), ("--am", "p.conf")]
    for args in chosen:
        assert user_chose_pml(args, {}), args
        assert skip_cm_args(args, {}, [[]], files=[]) == args, args
    for env in ({"OMPI_MCA_pml": "^ucx"}, {"OMPI_MCA_mtl": "ofi"}, {"OMPI_MCA_mtl_ofi_provider_include": "psm3"},
                {"FI_PROVIDER": "psm3"}, {"OMPI_MCA_mca_base_param_files": "/x.conf"}):
        assert user_chose_pml((), env), env
    # a component's own parameter, or another framework's, is not a choice of the PML
    for args, env in ((("--mca", "pml_ucx_tls", "tcp"), {}), (("--mca", "btl", "self"), {}),
                      ((), {"OMPI_MCA_btl_tcp_if_include": "eth0"}), (("pml",), {})):
        assert not user_chose_pml(args, env), (args, env)


def test_a_parameter_files_exclusion_is_kept_and_its_choice_respected(tmp_path):
    debian = tmp_path / "openmpi-mca-params.conf"
    debian.write_text(DEBIAN)
    assert file_params([str(debian)])["pml"] == "^ucx"
    # the command line replaces the file's pml: Debian's exclusion of ucx is kept beside cm's
    assert skip_cm_args((), {}, [[]], files=[str(debian)]) == ("--mca", "pml", "^ucx,cm")
    user = tmp_path / "mca-params.conf"
    for text in ("pml = ob1\n", "mtl = psm2  # Omni-Path\n", "mtl_ofi_provider_include = psm3\n"):
        user.write_text(text)
        assert skip_cm_args((), {}, [[]], files=[str(debian), str(user)]) == (), text   # a choice: left alone
    user.write_text("# pml = ob1\npml = ^cm,ucx\n")   # the later file wins; cm named once
    assert skip_cm_args((), {}, [[]], files=[str(debian), str(user)]) == ("--mca", "pml", "^cm,ucx")
    assert file_params([str(tmp_path / "missing.conf")]) == {}


def test_the_parameter_files_searched(tmp_path):
    (tmp_path / "home" / ".openmpi").mkdir(parents=True)
    (tmp_path / "home" / ".openmpi" / "mca-params.conf").write_text("pml = ob1\n")
    (tmp_path / "opt" / "bin").mkdir(parents=True)
    (tmp_path / "opt" / "etc").mkdir()
    (tmp_path / "opt" / "etc" / "openmpi-mca-params.conf").write_text("")
    mpirun = tmp_path / "opt" / "bin" / "mpirun"
    mpirun.touch()
    found = param_files({"HOME": str(tmp_path / "home")}, mpirun=str(mpirun))
    assert found[-2:] == [str(tmp_path / "opt" / "etc" / "openmpi-mca-params.conf"),
                          str(tmp_path / "home" / ".openmpi" / "mca-params.conf")]   # the user's last: it wins
