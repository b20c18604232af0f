"""The FineTuneJob API: schema (single source of truth), cross-field rules, structural validation."""
