"""Target profiles: every built-in validates, and a bad file is refused naming the file, the field and what is allowed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgekit.errors import ConfigError
from edgekit.plan.targets import (
    TARGETS_DIR_ENV,
    builtin_targets_dir,
    discover_targets,
    load_target,
    load_target_file,
)

REQUIRED = ("orin", "agx-orin-64gb", "agx-orin-32gb", "orin-nx-16gb", "orin-nx-8gb", "orin-nano-8gb", "orin-nano-4gb", "h200")


def _orin_doc() -> dict:
    return yaml.safe_load((builtin_targets_dir() / "orin.yaml").read_text())


def _write(tmp_path: Path, doc: dict, name: str = "custom") -> Path:
    doc = dict(doc, name=name)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_every_required_target_is_built_in_and_valid():
    found = discover_targets()
    assert set(REQUIRED) <= set(found)
    for name, tf in found.items():
        assert tf.builtin and tf.target.name == name


def test_orin_is_the_product_card_profile():
    t = load_target("orin")
    assert t.arch == "sm_87" and t.gpu.compute_capability == 87
    assert t.smem_budget_bytes == 131072
    assert t.memory_bytes == 24 * 1024**3 and t.memory.unified
    assert t.watchdog.jitter_budget_ms == 5.0 and t.watchdog.power_band_w == 3.0


def test_h200_is_the_development_target():
    t = load_target("h200")
    assert t.arch == "sm_90" and t.gpu.sms == 132 and t.smem_budget_bytes == 227 * 1024
    assert not t.memory.unified and t.memory.os_headroom_gib == 0


def test_mode_peaks_scale_with_sms_and_clock():
    t = load_target("orin-nano-4gb")
    full = t.power_mode("25W")  # all 4 SMs at 1020 MHz: the module peak
    assert t.mode_int8_tops(full) == pytest.approx(t.gpu.int8_dense_tops)
    slow = t.power_mode("7W_AI")  # same SMs, 408 MHz
    assert t.mode_int8_tops(slow) == pytest.approx(t.gpu.int8_dense_tops * 408 / 1020)
    agx = load_target("agx-orin-64gb")
    m15 = agx.power_mode("15W")  # 6 of 16 SMs at 408 of 1300 MHz
    assert agx.mode_fp16_tflops(m15) == pytest.approx(agx.gpu.fp16_dense_tflops * 6 / 16 * 408 / 1300)


def test_nano_super_modes_raise_bandwidth():
    t = load_target("orin-nano-8gb")
    assert t.power_mode("15W").dram_bandwidth_gbps < t.power_mode("25W").dram_bandwidth_gbps
    assert t.power_mode("25W").super_config and not t.power_mode("15W").super_config


def test_unknown_field_names_file_field_and_allowed_fields(tmp_path):
    doc = _orin_doc()
    doc["gpu"]["shared_memory"]["per_block_bytes"] = 1000  # a plausible typo
    p = _write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_target_file(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "gpu.shared_memory.per_block_bytes" in msg
    assert "per_block_budget_bytes" in msg  # the allowed names are listed


def test_bad_arch_lists_allowed_values(tmp_path):
    doc = _orin_doc()
    doc["gpu"]["arch"] = "sm_75"
    with pytest.raises(ConfigError) as e:
        load_target_file(_write(tmp_path, doc))
    msg = str(e.value)
    assert "gpu.arch" in msg and "'sm_75'" in msg and "'sm_87'" in msg and "'sm_90'" in msg


def test_string_where_number_expected_is_refused(tmp_path):
    doc = _orin_doc()
    doc["gpu"]["sms"] = "16"  # strict: no silent coercion
    with pytest.raises(ConfigError, match=r"gpu\.sms"):
        load_target_file(_write(tmp_path, doc))


def test_missing_field(tmp_path):
    doc = _orin_doc()
    del doc["watchdog"]["jitter_budget_ms"]
    with pytest.raises(ConfigError, match=r"missing field `watchdog\.jitter_budget_ms`"):
        load_target_file(_write(tmp_path, doc))


def test_budget_over_hardware_maximum(tmp_path):
    doc = _orin_doc()
    doc["gpu"]["shared_memory"]["per_block_budget_bytes"] = 200_000
    with pytest.raises(ConfigError, match="exceeds the hardware opt-in maximum"):
        load_target_file(_write(tmp_path, doc))


def test_default_power_mode_must_exist(tmp_path):
    doc = _orin_doc()
    doc["default_power_mode"] = "100W"
    with pytest.raises(ConfigError) as e:
        load_target_file(_write(tmp_path, doc))
    assert "'100W'" in str(e.value) and "MAXN" in str(e.value) and "30W" in str(e.value)


def test_mode_cannot_have_more_sms_than_the_gpu(tmp_path):
    doc = _orin_doc()
    doc["power_modes"][0]["active_sms"] = 32
    with pytest.raises(ConfigError, match="active_sms"):
        load_target_file(_write(tmp_path, doc))


def test_unified_memory_needs_os_headroom(tmp_path):
    doc = _orin_doc()
    doc["memory"]["os_headroom_gib"] = 0
    with pytest.raises(ConfigError, match="os_headroom_gib"):
        load_target_file(_write(tmp_path, doc))


def test_name_must_match_file_name(tmp_path):
    doc = _orin_doc()
    p = tmp_path / "other.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="other.yaml"):
        load_target_file(p)


def test_not_yaml_and_not_a_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_target_file(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_target_file(bad)


def test_bad_yaml_names_the_line_and_the_format(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ngpu: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line 3") as e:
        load_target_file(bad)
    assert e.value.hint and "orin.yaml" in e.value.hint


def test_binary_file_is_refused_not_a_traceback(tmp_path):
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00bin")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_target_file(bad)


def test_user_directory_adds_and_overrides(tmp_path, monkeypatch):
    doc = _orin_doc()
    doc["memory"]["total_gib"] = 16
    _write(tmp_path, doc, "my-board")
    _write(tmp_path, doc, "orin")  # replaces the built-in orin
    found = discover_targets(tmp_path)
    assert found["my-board"].target.memory.total_gib == 16 and not found["my-board"].builtin
    assert found["orin"].target.memory.total_gib == 16 and not found["orin"].builtin
    assert load_target("my-board", tmp_path).memory.total_gib == 16
    # the same through the environment variable
    monkeypatch.setenv(TARGETS_DIR_ENV, str(tmp_path))
    assert load_target("my-board").memory.total_gib == 16


def test_user_directory_takes_yml_files_as_target_does(tmp_path):
    """A profile saved as NAME.yml in --targets-dir was ignored without a word ('unknown target ...; add NAME.yaml')."""
    doc = _orin_doc()
    doc["memory"]["total_gib"] = 16
    (tmp_path / "my-board.yml").write_text(yaml.safe_dump(dict(doc, name="my-board")))
    assert discover_targets(tmp_path)["my-board"].path.name == "my-board.yml"
    assert load_target("my-board", tmp_path).memory.total_gib == 16
    doc["memory"]["total_gib"] = 8  # NAME.yaml wins over NAME.yml in one directory
    (tmp_path / "my-board.yaml").write_text(yaml.safe_dump(dict(doc, name="my-board")))
    assert discover_targets(tmp_path)["my-board"].path.name == "my-board.yaml"
    assert load_target("my-board", tmp_path).memory.total_gib == 8


def test_unknown_target_and_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="unknown target 'orin-nano'.*did you mean"):
        load_target("orin-nano")
    with pytest.raises(ConfigError, match="does not exist"):
        load_target("orin", tmp_path / "nope")
    # a file where a directory was asked for is not "missing"; a missing profile path is not an "unknown target"
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        load_target("orin", tmp_path / "a.gguf")
    with pytest.raises(ConfigError, match=r"target file .*nope\.yaml does not exist"):
        load_target(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"target file myboard\.yml does not exist"):  # no folder in the name
        load_target("myboard.yml")
    # a directory is not "an unknown target" to be fixed by adding "/tmp.yaml" to a --targets-dir
    with pytest.raises(ConfigError, match=r"is a directory, expected a target name or a profile file") as e:
        load_target(str(tmp_path))
    assert e.value.hint.startswith(f"pass --targets-dir {tmp_path} ")


def test_cli_refuses_a_bad_user_target_in_one_line(tmp_path):
    doc = _orin_doc()
    doc["gpu"]["arch"] = "sm_75"
    _write(tmp_path, doc, "broken")
    r = subprocess.run(
        [sys.executable, "-m", "edgekit", "targets", "show", "broken", "--targets-dir", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "broken.yaml" in lines[0] and "gpu.arch" in lines[0]


def test_a_name_the_bundle_manifest_would_refuse_fails_when_the_profile_loads(tmp_path):
    # one name rule for the profile and the manifest's target record: "orin.v2" used to pass here and
    # fail only when the bundle was signed
    from edgekit.bundle.manifest import Target as ManifestTarget

    with pytest.raises(ConfigError, match="name"):
        load_target_file(_write(tmp_path, _orin_doc(), name="orin.v2"))
    t = load_target("orin-nano-8gb")
    assert ManifestTarget(name=t.name, arch=t.gpu.compute_capability).name == t.name


@pytest.mark.parametrize("name", REQUIRED)
def test_each_profile_says_what_board_it_models_and_where_its_figures_come_from(name):
    d = load_target(name).description
    assert "Jetson" in d or "NVIDIA" in d, d  # a board a user can place
    assert "Figures:" in d, d  # and the source of its numbers
    assert "product card" not in d.lower()  # no internal words


def test_the_target_list_prints_every_description_in_full_when_piped():
    r = subprocess.run([sys.executable, "-m", "edgekit", "targets"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in REQUIRED:
        assert load_target(name).description in r.stdout  # not cut at 80 columns


def test_the_groups_json_flag_reaches_show():
    """`edgekit targets --json show orin` printed the tables (the group's --json reached only its error path, which
    did print JSON), so a script piping it to jq broke on the first box-drawing line."""
    r = subprocess.run([sys.executable, "-m", "edgekit", "targets", "--json", "show", "orin"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["name"] == "orin" and set(d["derived"]) == {m.name for m in load_target("orin").power_modes}
