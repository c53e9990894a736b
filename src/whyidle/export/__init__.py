"""Exports of a saved run to other tools' formats (Perfetto / Chrome trace timeline). Unlike the
report renderers in :mod:`whyidle.report`, an export reads the recorded run itself."""
