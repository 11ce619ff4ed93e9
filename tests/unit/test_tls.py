"""The HTTP clients' shared TLS context (gateway/core/tls.py) still verifies what a client's own would."""

from __future__ import annotations

import ssl

from gateway.core.tls import client_tls


def test_the_shared_context_verifies_certificates_and_host_names_and_is_made_once() -> None:
    context = client_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # the CA certificates are loaded
    assert client_tls() is context
