"""p4bs core: the command line, the deployment config, units and the Kafka record bus."""
