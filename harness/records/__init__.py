"""The run's record: the journal (writer, reader, schema), typed events, a run's summary and a
live job's status."""
