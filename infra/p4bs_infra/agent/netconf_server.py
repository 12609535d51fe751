"""NETCONF (over SSH) server for the router agent: get, get-config, edit-config on the same
OpenConfig QoS model as gNMI, in the namespace http://openconfig.net/yang/qos.

edit-config's <config> holds a <qos> subtree; it is validated and applied as one change (all or
nothing), so `running` changes at once (no candidate datastore). Subtree and XPath filters
work on get and get-config.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import netconf
from lxml import etree
from netconf import error as ncerror
from netconf import server as ncserver
from netconf import util as ncutil

from p4bs_infra.agent.datastore import LIST_KEYS, AgentError, PathElems, RouterQos

log = logging.getLogger(__name__)

OC_QOS_NS = "http://openconfig.net/yang/qos"
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
# The netconf package turns subtree filters into XPath using its registry of prefixes.
netconf.nsmap_add("oc-qos", OC_QOS_NS)
ERROR_TAGS = {
    AgentError.NOT_FOUND: "unknown-element",
    AgentError.INVALID: "invalid-value",
    AgentError.READ_ONLY: "operation-not-supported",
    AgentError.FAILED: "operation-failed",
}


def to_xml(name: str, value: Any, parent: etree._Element) -> None:
    """JSON (as the datastore serves it) -> XML children of `parent` in the QoS namespace."""
    if isinstance(value, list):
        for entry in value:
            to_xml(name, entry, parent)
        return
    node = etree.SubElement(parent, f"{{{OC_QOS_NS}}}{name}")
    if isinstance(value, dict):
        for child, child_value in value.items():
            to_xml(child, child_value, node)
    else:
        node.text = str(value)


def from_xml(node: etree._Element) -> Any:
    """XML of an edit -> the JSON shape the datastore takes; lists known by their names."""
    children = [c for c in node if isinstance(c.tag, str)]
    operation = node.get(f"{{{NC_NS}}}operation")
    if operation in ("delete", "remove"):
        raise AgentError(
            AgentError.READ_ONLY, f"{etree.QName(node).localname}: {operation} is not supported"
        )
    if not children:
        return (node.text or "").strip()
    out: dict[str, Any] = {}
    for child in children:
        name = etree.QName(child).localname
        if etree.QName(child).namespace not in (OC_QOS_NS, None):
            raise AgentError(AgentError.NOT_FOUND, f"{name}: unknown namespace")
        value = from_xml(child)
        if name in LIST_KEYS:
            out.setdefault(name, []).append(value)
        elif name in out:
            raise AgentError(AgentError.INVALID, f"{name}: given twice")
        else:
            out[name] = value
    return out


class QosMethods(ncserver.NetconfMethods):  # type: ignore[misc]
    def __init__(self, qos: RouterQos) -> None:
        self.qos = qos

    def nc_append_capabilities(self, capabilities: etree._Element) -> None:
        ncutil.subelm(
            capabilities, "capability"
        ).text = f"{OC_QOS_NS}?module=openconfig-qos&revision=2026-04-30"

    def _data(self, rpc: etree._Element, filter_or_none: Any, config_only: bool) -> Any:
        data = ncutil.elm("nc:data")
        qos = etree.SubElement(data, f"{{{OC_QOS_NS}}}qos", nsmap={None: OC_QOS_NS})
        for name, value in self.qos.tree(config_only).items():
            to_xml(name, value, qos)
        return ncutil.filter_results(rpc, data, filter_or_none)

    def rpc_get(self, session: Any, rpc: etree._Element, filter_or_none: Any) -> Any:
        return self._data(rpc, filter_or_none, config_only=False)

    def rpc_get_config(
        self, session: Any, rpc: etree._Element, source: Any, filter_or_none: Any
    ) -> Any:
        return self._data(rpc, filter_or_none, config_only=True)

    def rpc_edit_config(self, session: Any, rpc: etree._Element, *params: etree._Element) -> Any:
        by_name = {etree.QName(p).localname: p for p in params}
        target = by_name.get("target")
        if target is None or not len(target) or etree.QName(target[0]).localname != "running":
            raise ncerror.RPCServerError(
                rpc, "protocol", "invalid-value", message="only the running datastore can be edited"
            )
        config = by_name.get("config")
        if config is None:
            raise ncerror.MissingElementProtoError(rpc, ncutil.qname("nc:config"))
        try:
            updates: list[tuple[PathElems, Any]] = []
            for top in config:
                if etree.QName(top).localname != "qos" or etree.QName(top).namespace != OC_QOS_NS:
                    raise AgentError(
                        AgentError.NOT_FOUND,
                        f"{etree.QName(top).text}: only {{{OC_QOS_NS}}}qos is served",
                    )
                updates.append(([("qos", {})], from_xml(top)))
            self.qos.set(updates, [])
        except AgentError as err:
            log.info("NETCONF edit-config refused: %s", err)
            raise ncerror.RPCServerError(
                rpc, "application", ERROR_TAGS[err.kind], message=str(err)
            ) from err
        log.info("NETCONF edit-config applied")
        return etree.Element("ok")


class PasswordAuth(ncserver.SSHUserPassController):  # type: ignore[misc]
    """One user and password, compared in constant time."""

    def check_auth_password(self, username: str, password: str) -> int:
        ok = hmac.compare_digest(username.encode(), self.username.encode()) & hmac.compare_digest(
            password.encode(), self.password.encode()
        )
        if not ok:
            log.warning("NETCONF login refused: bad credentials")
        return int(ncserver.ssh.AUTH_SUCCESSFUL if ok else ncserver.ssh.AUTH_FAILED)


class EndAwareSession(ncserver.NetconfServerSession):  # type: ignore[misc]
    """A server session that tells its methods' `nc_session_ended(session)`, if they have
    one, when it ends, however: close-session, kill-session, or the client gone. (The netconf
    package itself tells only of locks a session held, and on a client that hangs up its
    reader thread just exits.)"""

    _told = False

    def close(self) -> None:
        ended = getattr(self.server.server_methods, "nc_session_ended", None)
        if ended is not None and not self._told and self.session_id is not None:
            self._told = True
            try:
                ended(self)
            except Exception:  # the session still closes
                log.exception("NETCONF session %s: ending it", self.session_id)
        super().close()

    def _reader_exits(self) -> None:
        super()._reader_exits()
        self.close()


def serve(methods: Any, port: int, host_key: str, username: str, password: str) -> Any:
    """A NETCONF server over SSH answering with `methods` (QosMethods, or the Junos mode's)."""
    server = ncserver.NetconfSSHServer(
        server_ctl=PasswordAuth(username, password),
        server_methods=methods,
        port=port,
        host_key=host_key,
    )
    # NetconfSSHServer fixes its session class in __init__, whose accept thread reads this
    # attribute at each connection: set before the agent says it serves (a client arriving
    # in between would get a plain session, which tells nothing of its end).
    server.server_session_class = EndAwareSession
    return server
