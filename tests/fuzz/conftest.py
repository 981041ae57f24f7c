"""The fuzz tier: every decoder of wire bytes against hostile inputs, no broker.
``make test`` runs it; ``make test-fast`` leaves it to ``make test``."""
