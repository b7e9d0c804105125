"""The CLI verbs, one module each: NAME, HELP, add_arguments(parser), run(ns) -> exit code.

Modules import their heavy dependencies inside `run`, so `tightkv --help` stays light.
"""

VERBS = ["run", "ppl", "bench", "serve", "client"]
VERBS += ["pull", "create", "list", "rm", "show"]
VERBS += ["niah"]
VERBS += ["plan"]
VERBS += ["ask", "cache"]
VERBS += ["docqa"]
