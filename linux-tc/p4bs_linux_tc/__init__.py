"""A Linux machine as a router whose output queues p4bs sizes: the queue layout (`queues`)
and just enough rtnetlink to read and change it (`netlink`). Imports nothing of the project;
the router agent and the testbed (p4bs_infra) and the linux-tc driver (p4bs_optimizer) share it.
"""
