//! `http.*`: outbound HTTP requests to an allow-list of hosts.
