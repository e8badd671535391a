"""The ``tokenmill`` command line: a small argparse frame whose subcommands are all contributed
through the pluggy ``register_commands`` hook -- core's own (``plugins``, ``env``, ...) exactly like
those of other distributions (``serve``, ``bench``, ``quantize``)."""
