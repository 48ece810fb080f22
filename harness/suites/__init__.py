"""Suites and scenarios: the YAML schema, its loader, -k selection and the property-based
strategies."""
