"""Reference implementation of the lease + fencing token + outbox protocol on psycopg 3."""
