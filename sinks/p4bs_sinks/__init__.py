"""The sinks: services beside the Flink jobs that carry their topics out of Kafka, into
InfluxDB (`influx_sink`) and to an Alertmanager webhook (`alerts`)."""
