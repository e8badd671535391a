"""``tokenmill bench serve``: a load client for a running server, and (``--peers``) the side-by-side
serving comparison of ``tokenmill serve`` and vLLM's server under vLLM's own load client."""
