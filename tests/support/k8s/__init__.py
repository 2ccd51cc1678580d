"""A fake API server with its CA, a CONNECT proxy and kubeconfigs, for the API client's tests."""
