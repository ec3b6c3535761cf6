"""``none``: every client is honest."""

from hetfed.engine.attacks import ClientAttack, register

register(ClientAttack("none", "every client is honest"))
