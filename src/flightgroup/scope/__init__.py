"""The seam between the engine and the wide scopes (directory, fleet, a fake one).

The engine (the in-process flight table) asks a scope "lead or join?" only through the
typed interface of :mod:`.interface`; answers come back as the typed events of
:mod:`.events`, and a leader hands its outcome over as one of the scope-neutral outcomes
of :mod:`.outcome`. Nothing here names a concrete scope, and no scope imports another.
"""
