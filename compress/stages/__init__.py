"""Stage kinds, one module each, every one exposing `KIND` (a compress.core.registry.StageKind).

Which modules are stages is data in compress.core.registry.CATALOGUE; a module is imported the
first time its kind is asked for. Each is small and imports no framework at module level,
so listing and validating stays fast.
"""
