"""The client library: the async client, its sync wrapper, the exactly-once writer, event codecs."""
