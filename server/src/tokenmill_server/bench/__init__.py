"""``tokenmill bench serve``: a load client for a running server."""
