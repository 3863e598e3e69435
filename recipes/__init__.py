"""The papers' training recipes as code (see each module's docstring)."""
