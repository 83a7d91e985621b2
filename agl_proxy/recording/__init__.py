"""One call recorded and turned into its span: `CallRecord`, a streamed answer reassembled, the
call's store-issued sequence number, and the batched exporter that writes spans off the call's
path."""
