"""The ``autosp-plan`` command lines (:mod:`.main` and its sub-commands) and what they print: parsers in,
reports out; the logic lives in the planner modules they call. Importing this package is instant."""
