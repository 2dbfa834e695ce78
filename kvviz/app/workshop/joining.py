"""Where a phone joins the class: the address shown on the host's page and the projector, with its QR
code (``segno``, pure Python, as SVG).

The address is, in order: ``KVVIZ_JOIN_URL`` when set (a server behind a proxy or a name of its
own); the address the host's browser reached the server by, when that is not this machine's
loopback (a phone on the same network reaches it the same way); this machine's network address,
when the server listens on every interface (``--host 0.0.0.0``); else the loopback address with a
warning, because no phone can reach it: restart with ``python app.py --host 0.0.0.0``.

The network address is read from the machine's own interfaces (no packet is sent).
"""

from __future__ import annotations

import fcntl
import io
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from functools import lru_cache

import segno

JOIN_URL_ENV = "KVVIZ_JOIN_URL"
EVERY_INTERFACE = ("0.0.0.0", "::", "")
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
LOOPBACK_WARNING = ("This server listens on {host} only: phones cannot reach it. Restart it with "
                    "python app.py --host 0.0.0.0 (on a network you trust) and open this page again.")
NO_ADDRESS_WARNING = ("This machine has no network address that phones could reach; connect it to the "
                      "room's network, or set KVVIZ_JOIN_URL.")


@dataclass(frozen=True)
class JoinAddress:
    base: str  # scheme, host and port: "http://192.168.1.20:7860"
    warning: str = ""  # why phones cannot reach it, and what to do

    def url(self, code: str) -> str:
        return f"{self.base}/workshop/class/{code}"

    def shown(self) -> str:
        """The address as the room reads it: no scheme."""
        return self.base.split("://", 1)[-1] + "/workshop"


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(netloc: str) -> tuple[str, str]:
    """("192.168.1.20", "7860") from "192.168.1.20:7860"; ("::1", "7860") from "[::1]:7860"."""
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        return host, rest.lstrip(":")
    host, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
    return host, port


def _interface_address(name: str) -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


@lru_cache(maxsize=1)
def network_address() -> str | None:
    """This machine's IPv4 address on a network (a private one first), or None."""
    found = [_interface_address(name) for _, name in socket.if_nameindex()]
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    addresses = [ipaddress.ip_address(a) for a in found if a]
    usable = [a for a in addresses if not (a.is_loopback or a.is_link_local or a.is_unspecified)]
    usable.sort(key=lambda a: not a.is_private)
    return str(usable[0]) if usable else None


def join_address(listen_host: str, request_netloc: str, scheme: str = "http") -> JoinAddress:
    """Where phones join, for a server listening on ``listen_host`` whose page was opened at ``request_netloc``."""
    given = os.environ.get(JOIN_URL_ENV, "").strip().rstrip("/")
    if given:
        return JoinAddress(given)
    host, port = split_host(request_netloc)
    suffix = f":{port}" if port else ""
    if host and not is_loopback(host):
        return JoinAddress(f"{scheme}://{request_netloc}")
    if listen_host in EVERY_INTERFACE:
        found = network_address()
        return JoinAddress(f"{scheme}://{found}{suffix}") if found else JoinAddress(f"{scheme}://{request_netloc}", NO_ADDRESS_WARNING)
    if not is_loopback(listen_host):
        return JoinAddress(f"{scheme}://{listen_host}{suffix}")
    return JoinAddress(f"{scheme}://{request_netloc}", LOOPBACK_WARNING.format(host=listen_host))


def qr_svg(url: str) -> bytes:
    """The QR code of ``url`` as an SVG document (dark on white, with its quiet zone)."""
    out = io.BytesIO()
    segno.make(url, error="m").save(out, kind="svg", scale=8, dark="#1d2433", light="#ffffff", title=url)
    return out.getvalue()
