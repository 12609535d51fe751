"""Starting the real components locally: the Kafka broker, InfluxDB, later the testbed."""
