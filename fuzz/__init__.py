"""Coverage-guided fuzz targets (atheris): one module per target, one seed corpus per target.

Every target module defines ``fuzz_one(data: bytes) -> None``, which holds the contract: any
input ends in a valid result (checked) or one of the project's typed errors (caught there).
Anything else that escapes — another exception, a failed check, a hang, runaway memory — is a
finding. ``python -m fuzz.run`` runs them (``make fuzz``); ``tests/fuzz`` runs each briefly.
"""
