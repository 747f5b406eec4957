import socket

import pytest


def test_non_loopback_connections_are_refused() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(OSError, match="loopback"):
        s.connect(("93.184.216.34", 80))
    s.close()
