"""The run's record: the journal (writer, reader, schema), every event kind typed, the journal
queries the checks share (`timeline`), detector names, a run's summary and a live job's
status."""
