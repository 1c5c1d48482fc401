"""Everything that does I/O for a device: transports, the sync driver and the command line."""
