"""The YANG helper on the vendors' published models: their example instances pass, each kind
of mistake is rejected naming the node, NETCONF merges and XML round trips follow the model."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from p4bs.yang import YANG_DIR_ENV, YangError, YangModel, yang_dir, yang_model

OC_PROFILE = ("openconfig-qos:qos", "buffer-allocation-profiles", "buffer-allocation-profile")
JUNOS_COS = ("junos-conf-root:configuration", "junos-conf-class-of-service:class-of-service")


def _example(name: str) -> dict[str, Any]:
    data = json.loads((yang_dir() / "examples" / name).read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture
def openconfig() -> dict[str, Any]:
    return _example("openconfig-qos-buffer.json")


@pytest.fixture
def junos() -> dict[str, Any]:
    return _example("junos-cos-buffer.json")


def _profile_queue_config(doc: dict[str, Any]) -> dict[str, Any]:
    profile = doc[OC_PROFILE[0]][OC_PROFILE[1]][OC_PROFILE[2]][0]
    config = profile["queues"]["queue"][0]["config"]
    assert isinstance(config, dict)
    return config


def _scheduler(doc: dict[str, Any]) -> dict[str, Any]:
    scheduler = doc[JUNOS_COS[0]][JUNOS_COS[1]]["schedulers"][0]
    assert isinstance(scheduler, dict)
    return scheduler


def test_the_published_examples_validate(openconfig: dict[str, Any], junos: dict[str, Any]) -> None:
    yang_model("openconfig").validate(openconfig)
    yang_model("junos").validate(junos)
    temporal = copy.deepcopy(openconfig)
    config = _profile_queue_config(temporal)
    del config["dedicated-buffer"]
    config["dedicated-buffer-temporal"] = "50000"
    yang_model("openconfig").validate(temporal)


def test_a_uint64_written_as_a_json_number_is_rejected(openconfig: dict[str, Any]) -> None:
    _profile_queue_config(openconfig)["dedicated-buffer"] = 625000
    with pytest.raises(YangError, match=r"dedicated-buffer\} expected uint64"):
        yang_model("openconfig").validate(openconfig)


def test_an_unknown_leaf_is_rejected(openconfig: dict[str, Any]) -> None:
    _profile_queue_config(openconfig)["buffer-size"] = "625000"
    with pytest.raises(YangError, match="config/buffer-size"):
        yang_model("openconfig").validate(openconfig)


def test_a_dangling_leafref_is_rejected(openconfig: dict[str, Any]) -> None:
    qos = openconfig["openconfig-qos:qos"]
    qos["interfaces"]["interface"][0]["output"]["config"]["buffer-allocation-profile"] = "other"
    with pytest.raises(YangError, match="buffer-allocation-profile} instance-required"):
        yang_model("openconfig").validate(openconfig)
    # The profile's queue must be a queue declared under /qos/queues.
    declared = copy.deepcopy(openconfig)
    del declared["openconfig-qos:qos"]["queues"]
    with pytest.raises(YangError, match="instance-required"):
        yang_model("openconfig").validate(declared)


def test_junos_percent_out_of_range_and_two_cases_are_rejected(junos: dict[str, Any]) -> None:
    _scheduler(junos)["buffer-size"] = {"percent": 130}
    with pytest.raises(YangError, match="buffer-size/percent"):
        yang_model("junos").validate(junos)
    _scheduler(junos)["buffer-size"] = {"percent": 30}
    yang_model("junos").validate(junos)
    _scheduler(junos)["buffer-size"] = {"percent": 30, "temporal": "50000"}
    with pytest.raises(YangError, match="member-not-allowed: temporal"):
        yang_model("junos").validate(junos)


def test_merge_follows_list_keys_and_replaces_the_other_case(junos: dict[str, Any]) -> None:
    model = yang_model("junos")
    patch = {
        JUNOS_COS[0]: {
            JUNOS_COS[1]: {
                "schedulers": [
                    {"name": "p4bs-be", "buffer-size": {"percent": 20}},
                    {"name": "other", "buffer-size": {"temporal": "100"}},
                ]
            }
        }
    }
    merged = model.merge(junos, patch)
    schedulers = merged[JUNOS_COS[0]][JUNOS_COS[1]]["schedulers"]
    assert schedulers == [
        {"name": "p4bs-be", "buffer-size": {"percent": 20}},  # temporal went with its case
        {"name": "other", "buffer-size": {"temporal": "100"}},
    ]
    assert (
        merged[JUNOS_COS[0]][JUNOS_COS[1]]["interfaces"]
        == junos[JUNOS_COS[0]][JUNOS_COS[1]]["interfaces"]
    )
    model.validate(merged)
    # Two cases in one patch are the patch's mistake: kept, for validation to refuse.
    both = {"percent": 20, "temporal": "100"}
    patch[JUNOS_COS[0]][JUNOS_COS[1]]["schedulers"] = [{"name": "p4bs-be", "buffer-size": both}]
    with pytest.raises(YangError, match="member-not-allowed"):
        model.validate(model.merge(junos, patch))
    with pytest.raises(YangError, match="no member 'buffer'"):
        model.merge(junos, {JUNOS_COS[0]: {JUNOS_COS[1]: {"buffer": 1}}})


def test_xml_round_trip_and_type_errors_in_xml(junos: dict[str, Any]) -> None:
    model = yang_model("junos")
    element = model.to_xml(junos)
    assert model.from_xml(element) == junos
    text = etree.tostring(element).decode()
    assert "<temporal>50000</temporal>" in text
    assert element[0].tag == "{http://yang.juniper.net/junos/conf/root}configuration"
    bad = copy.deepcopy(element)
    (percent_parent,) = bad.xpath("//*[local-name()='buffer-size']")
    etree.SubElement(percent_parent, etree.QName(percent_parent, "nonsense")).text = "1"
    with pytest.raises(YangError, match="nonsense"):
        model.from_xml(bad)
    plain = etree.fromstring(b"<config><configuration/></config>")
    with pytest.raises(YangError, match="<configuration> has no XML namespace"):
        model.from_xml(plain)


def test_a_missing_yang_folder_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(YANG_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(YangError, match=f"no YANG models at .*nowhere.*\\${YANG_DIR_ENV}"):
        YangModel("junos")
    with pytest.raises(YangError, match="no YANG dialect 'cisco'"):
        YangModel("cisco", folder=tmp_path)
    with pytest.raises(YangError, match="do not load"):
        YangModel("junos", folder=tmp_path)
