"""The router agent: gNMI and NETCONF management for a Linux router's output queues.

Runs inside the router's network namespace (`python -m p4bs_infra.agent`). Both servers read
and write one datastore, `datastore.RouterQos`, a subset of OpenConfig QoS mapped onto htb
classes with a bfifo each (see datastore.py); in its Junos mode (junos.py) NETCONF serves Junos
class-of-service with a candidate datastore and confirmed commits, applied to that one.
"""
