"""Router payloads checked against the vendors' YANG models (p4bs.yang), as a router that
validates its configuration would: a gNMI Set or a NETCONF edit-config is merged into the
router's configuration and the result validated whole (a leafref may point at what the
router already has). The payloads are recorded on their way out of the real client
libraries (`Recorder`), so what is checked is what went on the wire."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from lxml import etree
from ncclient.operations.edit import EditConfig
from pygnmi.client import construct_update_message, gNMIclient
from pygnmi.create_gnmi_path import gnmi_path_generator

from p4bs.yang import PathElems, YangError, delete, embed, yang_model

OC_QOS_MODULE = "openconfig-qos"


def gnmi_elems(path: str) -> PathElems:
    """A path string as pygnmi puts it on the wire: [('qos', {}), ('b', {'k': 'v'}), ...]."""
    return [(e.name, dict(e.key)) for e in gnmi_path_generator(path).elem]


def after_gnmi_set(
    config: dict[str, Any], updates: list[tuple[str, bytes]], deletes: list[str]
) -> dict[str, Any]:
    """The OpenConfig configuration after a Set (deletes first, then the JSON_IETF updates as
    their bytes went), validated. Raises YangError naming what the schema refuses."""
    model = yang_model("openconfig")
    doc = copy.deepcopy(config)
    for path in deletes:
        if not delete(doc, gnmi_elems(path), OC_QOS_MODULE):
            raise YangError(f"delete: nothing at {path}")
    for path, raw in updates:
        try:
            value = json.loads(raw)
        except ValueError:
            raise YangError(f"{path}: the value {raw!r} is not JSON") from None
        doc = model.merge(doc, embed(gnmi_elems(path), value, OC_QOS_MODULE))
    model.validate(doc)
    return doc


def after_edit_config(dialect: str, config: dict[str, Any], payload: str) -> dict[str, Any]:
    """The configuration after merging an edit-config's <config> (XML), validated."""
    model = yang_model(dialect)
    doc = model.merge(config, model.from_xml(etree.fromstring(payload.encode())))
    model.validate(doc)
    return doc


@dataclass
class GnmiSet:
    config: dict[str, Any]  # the router's, just before the Set
    updates: list[tuple[str, bytes]]  # path, JSON_IETF bytes as pygnmi sent them
    deletes: list[str]


@dataclass
class Edit:
    config: dict[str, Any]  # the router's, just before the edit
    target: str
    payload: str  # the <config> element


@dataclass
class Recorder:
    """gNMI Sets and NETCONF edit-configs made in this process while `record()` is active,
    each with the router's configuration just before it (`snapshot`, called then)."""

    snapshot: Callable[[], dict[str, Any]]
    sets: list[GnmiSet] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)

    @contextmanager
    def record(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
        real_set: Callable[..., Any] = gNMIclient.set
        real_edit: Callable[..., Any] = EditConfig.request

        def recording_set(client: gNMIclient, *args: Any, **kwargs: Any) -> Any:
            update = kwargs.get("update") or []
            encoding = kwargs.get("encoding", "json")
            wire = construct_update_message(update, encoding) if update else []
            updates = [
                (path, msg.val.json_ietf_val) for (path, _), msg in zip(update, wire, strict=True)
            ]
            self.sets.append(GnmiSet(self.snapshot(), updates, list(kwargs.get("delete") or [])))
            return real_set(client, *args, **kwargs)

        def recording_edit(op: EditConfig, config: Any, *args: Any, **kwargs: Any) -> Any:
            text = config if isinstance(config, str) else etree.tostring(config).decode()
            target = str(kwargs.get("target", "candidate"))
            self.edits.append(Edit(self.snapshot(), target, text))
            return real_edit(op, config, *args, **kwargs)

        monkeypatch.setattr(gNMIclient, "set", recording_set)
        monkeypatch.setattr(EditConfig, "request", recording_edit)
        try:
            yield self
        finally:
            monkeypatch.setattr(gNMIclient, "set", real_set)
            monkeypatch.setattr(EditConfig, "request", real_edit)
