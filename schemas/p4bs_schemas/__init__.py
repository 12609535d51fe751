"""Avro schemas of every p4bs topic, their codec, and the backward-compatibility rules."""
