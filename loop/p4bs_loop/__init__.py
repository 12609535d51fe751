"""The closed loop on one machine (`closed_loop`): exporter, metrics job and optimizer around a
testbed, each a process of its own; and `p4bs demo`, which runs it live with a report."""
