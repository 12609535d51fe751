"""The optimizer: policies that turn link metrics into buffer sizes, router drivers that
apply them, and the service that runs both for many links (optimizer/README.md)."""
