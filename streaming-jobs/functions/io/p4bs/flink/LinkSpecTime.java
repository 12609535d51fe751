package io.p4bs.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * The event time of a links-topic record read as raw bytes (key and value): its ts_ns floored to
 * the ms, Flink's event-time precision, once the whole record has passed LinkSpecReader's checks.
 * A record that does not (not Avro, cut short, a value out of range, a key not a link id's shape,
 * a tombstone) gives 0, which the job drops before its windows, and is counted (metric
 * malformed_link_specs) and logged with what was wrong: one bad record on the topic must not stop
 * the job, which reads the topic from its start.
 */
public class LinkSpecTime extends ScalarFunction {
  private static final long serialVersionUID = 1L;

  private transient LinkSpecReader reader;
  private transient Counter malformed;

  @Override
  public void open(FunctionContext context) {
    reader = new LinkSpecReader();
    malformed = JobCounters.counter(context, LinkSpecReader.MALFORMED_METRIC);
  }

  public @DataTypeHint("BIGINT NOT NULL") long eval(String linkId, byte[] value) {
    try {
      reader.read(linkId, value);
      return reader.tsNs / 1_000_000L;
    } catch (AvroReader.Malformed e) {
      AvroReader.count(malformed, LinkSpecReader.WHAT, e);
      return IntervalTime.MALFORMED;
    }
  }
}
