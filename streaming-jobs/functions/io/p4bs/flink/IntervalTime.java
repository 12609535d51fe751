package io.p4bs.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * The event time of a link interval's record read as raw bytes: its interval's last ns (ts_ns -
 * 1) floored to the ms, Flink's event-time precision. The metrics job's source computes its
 * rowtime from it, so only the first three fields of a record are decoded there;
 * IntervalSummary reads the rest in the window.
 *
 * <p>A value whose header does not decode gives 0 (1970, never a real interval's time: the job
 * drops rows at it before its windows) and is counted (metric malformed_link_counters) and logged
 * with what was wrong; event time must be a number, and one bad record must not stop the job. So
 * does a record whose interval ends more than MAX_AHEAD_MS after this host's clock: its time
 * would move its partition's event time past the windows of every other link there, and their
 * records would all come late (a forged record, or an exporter whose clock jumped).
 */
public class IntervalTime extends ScalarFunction {
  private static final long serialVersionUID = 1L;
  static final long MALFORMED = 0;
  /** How far an interval may end ahead of this host's clock: clocks kept by NTP differ by ms. */
  static final long MAX_AHEAD_MS = 60_000;

  private transient IntervalReader reader;
  private transient Counter malformed;

  @Override
  public void open(FunctionContext context) {
    reader = new IntervalReader();
    malformed = JobCounters.counter(context, IntervalReader.MALFORMED_METRIC);
  }

  public @DataTypeHint("BIGINT NOT NULL") long eval(byte[] record) {
    try {
      return eventTimeMs(reader, record, System.currentTimeMillis());
    } catch (AvroReader.Malformed e) {
      AvroReader.count(malformed, IntervalReader.WHAT, e);
      return MALFORMED;
    }
  }

  /** The event time (ms) of an interval's record read with `reader`, at `nowMs` on this host. */
  static long eventTimeMs(IntervalReader reader, byte[] record, long nowMs)
      throws AvroReader.Malformed {
    long endMs = Math.floorDiv(reader.readEnd(record) - 1, 1_000_000L);
    if (endMs - nowMs > MAX_AHEAD_MS) {
      throw new AvroReader.Malformed(
          "its interval ends "
              + (endMs - nowMs)
              + " ms after this host's clock (at most "
              + MAX_AHEAD_MS
              + ")");
    }
    return endMs;
  }
}
