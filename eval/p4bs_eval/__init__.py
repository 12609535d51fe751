"""p4bs's evaluation playground: scenarios run through the whole pipeline, and reports."""
