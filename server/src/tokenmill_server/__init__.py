"""tokenmill-server: ``tokenmill serve`` — OpenAI- and Anthropic-compatible HTTP APIs and a gRPC
service over an engine-core process."""

__version__ = "0.1.0"
