"""Command line of the runtime (placeholder replaced below)."""


def main() -> int:
    return 0
