"""Router drivers: one interface (`base.RouterDriver`) over gNMI, NETCONF and Linux tc."""
