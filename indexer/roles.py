"""The two roles a text is embedded in: a strategy may embed a query and a document differently
(their templates, the prepended tokens). Apart from the strategies so naming a role costs nothing."""

from __future__ import annotations

from typing import Literal

Role = Literal["document", "query"]
ROLES: tuple[Role, ...] = ("document", "query")
