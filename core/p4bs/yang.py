"""Router configuration checked against the vendors' published YANG models (yangson).

The models are not part of the repository: they sit in `shared/yang/` beside the checkout
(`$P4BS_YANG_DIR` overrides it), one library per dialect: OpenConfig QoS (what the gNMI and
the OpenConfig NETCONF drivers write) and Junos class-of-service (the Junos NETCONF driver).
A `YangModel` is loaded once per dialect (`yang_model`) and then:

- `validate(raw)`: an RFC 7951 JSON instance, as config content, or `YangError` naming the
  node and what is wrong (a uint64 written as a JSON number, an unknown member, a dangling
  leafref, a value out of range, two cases of one choice);
- `from_xml(element)`: a NETCONF <config>/<data> element's children as RFC 7951 JSON
  (types checked, nothing else), and `to_xml(raw)` back;
- `merge(base, patch)`: a NETCONF "merge" of one document into another (list entries by
  their keys; a case of a choice replaces the other cases);
- `scalar(names, text)`: a leaf's value given as text (a gNMI typed scalar) as RFC 7951 JSON.

`embed` and `delete` place a value at, or remove the node at, a gNMI-style path (a list of
(name, keys)) in an RFC 7951 document: how a gNMI Set is applied to a configuration.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from lxml import etree
from yangson import DataModel
from yangson.enumerations import ContentType, ValidationScope
from yangson.exceptions import YangsonException
from yangson.schemanode import (
    CaseNode,
    ChoiceNode,
    InternalNode,
    LeafListNode,
    ListNode,
    SchemaNode,
)
from yangson.statement import ModuleParser

from p4bs import paths

YANG_DIR_ENV = "P4BS_YANG_DIR"
# Dialect -> (YANG library file, folder of its modules), inside the YANG folder.
DIALECTS = {
    "openconfig": ("yang-library-openconfig.json", "openconfig"),
    "junos": ("yang-library-junos.json", "junos"),
}

RawObject = dict[str, Any]
PathElems = list[tuple[str, dict[str, str]]]


class YangError(ValueError):
    """A document a model rejects, or a model that cannot be loaded."""


def yang_dir() -> Path:
    """The folder of the published models: $P4BS_YANG_DIR, else `shared/yang` beside the
    checkout (where CI puts a copy of shared/)."""
    override = os.environ.get(YANG_DIR_ENV)
    folder = Path(override) if override else paths.home().parent / "shared" / "yang"
    if not folder.is_dir():
        raise YangError(
            f"no YANG models at {folder}: put the vendors' models (shared/yang) there or set "
            f"${YANG_DIR_ENV} to their folder"
        )
    return folder


class _Yang10Escapes(dict[str, str]):
    """YANG 1.0 keeps an unknown escape in a double-quoted string as it is (the Junos module
    writes "\\*"); yangson parses YANG 1.1, which rejects it."""

    def __missing__(self, char: str) -> str:
        return "\\" + char


@contextmanager
def _yang10_escapes() -> Iterator[None]:
    original = ModuleParser.unescape_map
    ModuleParser.unescape_map = _Yang10Escapes(original)
    try:
        yield
    finally:
        ModuleParser.unescape_map = original


class YangModel:
    """One dialect's data model, loaded from the YANG folder."""

    def __init__(self, dialect: str, folder: Path | None = None) -> None:
        if dialect not in DIALECTS:
            raise YangError(f"no YANG dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        base = folder or yang_dir()
        library, modules = DIALECTS[dialect]
        self.dialect = dialect
        try:
            with _yang10_escapes():
                self._dm = DataModel.from_file(str(base / library), [str(base / modules)])
        except (OSError, YangsonException) as exc:
            raise YangError(f"the {dialect} YANG models in {base} do not load: {exc}") from exc

    def validate(self, raw: RawObject) -> None:
        """Raises YangError unless `raw` is a valid configuration (RFC 7951 JSON)."""
        try:
            self._dm.from_raw(raw).validate(ValidationScope.all, ContentType.config)
        except YangsonException as exc:
            raise YangError(f"{self.dialect}: {type(exc).__name__}: {exc}") from exc

    def from_xml(self, element: Any) -> RawObject:
        """The children of `element` (an lxml or ElementTree <config>/<data> element) as RFC
        7951 JSON. Raises YangError for a node the model lacks or a value of the wrong type."""
        for top in element:
            if isinstance(top.tag, str) and not top.tag.startswith("{"):
                raise YangError(f"{self.dialect}: <{top.tag}> has no XML namespace")
        try:
            raw = self._dm.from_xml(element).raw_value()
        except YangsonException as exc:
            raise YangError(f"{self.dialect}: {type(exc).__name__}: {exc}") from exc
        assert isinstance(raw, dict)
        return raw

    def to_xml(self, raw: RawObject) -> etree._Element:
        """RFC 7951 JSON as XML: a wrapper element whose children are the top nodes, each in
        its module's namespace."""
        try:
            element = self._dm.from_raw(raw).to_xml()
        except YangsonException as exc:
            raise YangError(f"{self.dialect}: {type(exc).__name__}: {exc}") from exc
        # yangson writes namespaces as plain xmlns attributes: parsed, they become the
        # elements' namespaces.
        return etree.fromstring(ElementTree.tostring(element))

    def merge(self, base: RawObject, patch: RawObject) -> RawObject:
        """`patch` merged into `base` as NETCONF's default operation does; a new object."""
        return _merge_object(self._dm.schema, None, base, patch)

    def scalar(self, module: str, names: list[str], text: str) -> Any:
        """The leaf at `names` (data node names from the top, in `module` unless prefixed)
        given `text`, as RFC 7951 JSON (a uint64 as a string, a uint8 as a number). Raises
        YangError for a path that is no leaf or text its type does not take."""
        node: Any = self._dm.schema
        ns: str | None = module
        for member in names:
            if not isinstance(node, InternalNode):
                raise YangError(f"{self.dialect}: {'/'.join(names)}: {member!r} is below a leaf")
            node = _child(node, member, ns)
            ns = node.ns
        leaf_type = getattr(node, "type", None)
        if leaf_type is None:
            raise YangError(f"{self.dialect}: {'/'.join(names)} is not a leaf")
        value = leaf_type.parse_value(text)
        if value is None:
            raise YangError(f"{self.dialect}: {'/'.join(names)}: {text!r} is not a {leaf_type}")
        return leaf_type.to_raw(value)


def embed(elems: PathElems, value: Any, module: str) -> RawObject:
    """`value` at a gNMI path as a whole RFC 7951 document (list entries carry their keys;
    the top member qualified by `module` unless the path's first name is)."""
    node = value
    for name, keys in reversed(elems):
        node = {name: [{**keys, **node}]} if keys else {name: node}
    ((top, child),) = node.items()
    return {top if ":" in top else f"{module}:{top}": child}


def delete(doc: RawObject, elems: PathElems, module: str) -> bool:
    """Removes the node at a gNMI path from `doc` (a list entry by its keys); False if there
    is none."""
    node: Any = doc
    (first, first_keys), *rest = elems
    steps = [(first if ":" in first else f"{module}:{first}", first_keys), *rest]
    for i, (name, keys) in enumerate(steps):
        last = i == len(steps) - 1
        child = node.get(name) if isinstance(node, dict) else None
        if child is None:
            return False
        if keys:
            if not isinstance(child, list):
                return False
            entries = [e for e in child if all(str(e.get(k)) == v for k, v in keys.items())]
            if not entries:
                return False
            if last:
                child.remove(entries[0])
                return True
            node = entries[0]
        elif last:
            del node[name]
            return True
        else:
            node = child
    return False


@functools.cache
def yang_model(dialect: str) -> YangModel:
    """The dialect's model, loaded once per process (about 0.2 s)."""
    return YangModel(dialect)


def _qualified(member: str, parent_ns: str | None) -> tuple[str, str | None]:
    """An RFC 7951 member name -> (name, module): unprefixed names inherit the parent's."""
    prefix, _, name = member.rpartition(":")
    return name, prefix or parent_ns


def _child(node: InternalNode, member: str, ns: str | None) -> SchemaNode:
    name, child_ns = _qualified(member, ns)
    child = node.get_data_child(name, child_ns)
    if child is None:
        raise YangError(f"{node.data_path()}: no member {member!r} in the model")
    assert isinstance(child, SchemaNode)
    return child


def _case_of(node: SchemaNode) -> CaseNode | None:
    """The nearest case `node` belongs to, between it and its data parent; None if none."""
    parent = node.parent
    while isinstance(parent, ChoiceNode | CaseNode):
        if isinstance(parent, CaseNode):
            return parent
        parent = parent.parent
    return None


def _merge_object(
    node: InternalNode, ns: str | None, base: RawObject, patch: RawObject
) -> RawObject:
    out = dict(base)
    for member, value in patch.items():
        child = _child(node, member, ns)
        qualified = (child.name, child.ns)
        existing = next((m for m in out if _qualified(m, ns) == qualified), member)
        case = _case_of(child)
        if case is not None:  # the other cases of its choice go, unless the patch sets them
            for other in [m for m in out if m not in patch]:
                other_case = _case_of(_child(node, other, ns))
                if (
                    other_case is not None
                    and other_case is not case
                    and other_case.parent is case.parent
                ):
                    del out[other]
        old = out.pop(existing, None)
        if isinstance(child, ListNode):
            out[member] = _merge_list(child, old or [], value)
        elif isinstance(child, LeafListNode):
            out[member] = list(dict.fromkeys([*(old or []), *value]))
        elif isinstance(child, InternalNode) and isinstance(value, dict):
            out[member] = _merge_object(child, child.ns, old or {}, value)
        else:
            out[member] = value
    return out


def _merge_list(node: ListNode, base: list[Any], patch: list[Any]) -> list[Any]:
    keys = [name for name, _ in node.keys]

    def key_of(entry: Any) -> tuple[str, ...]:
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise YangError(f"{node.data_path()}: a list entry lacks its keys {keys}")
        return tuple(str(entry[k]) for k in keys)

    entries = {key_of(entry): entry for entry in base}
    for entry in patch:
        key = key_of(entry)
        entries[key] = _merge_object(node, node.ns, entries.get(key, {}), entry)
    return list(entries.values())
