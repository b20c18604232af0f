"""Images tier: static Dockerfile checks and the smoke test of the built cpu image."""
