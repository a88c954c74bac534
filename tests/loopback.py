"""HTTP to the servers the tests start on loopback, through one client for the process.

``httpx.get`` and ``httpx.post`` build a client, and with it a TLS context that parses the whole CA bundle, on every
call: CPU that a suite bound by CPU pays on every poll. This client builds it once. It keeps no connection between
calls, as ``httpx.get`` does not, so a server restarted on a port is met on a new connection; it stores no cookies
(the service sets none). Its timeout is httpx's default, as ``httpx.get``'s is.
"""

import httpx

client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
get, post = client.get, client.post
