"""The gRPC API: tokenmill.proto, its generated modules (grpcio-tools output, checked in) and the service."""
