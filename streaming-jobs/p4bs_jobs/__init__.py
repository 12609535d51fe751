"""PyFlink jobs turning raw data-plane records into per-link metrics and alerts."""
