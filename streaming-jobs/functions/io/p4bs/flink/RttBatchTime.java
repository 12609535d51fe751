package io.p4bs.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * The event time of an RTT batch read as raw bytes: its interval's last ns (ts_ns - 1) floored
 * to the ms, Flink's event-time precision. The metrics job's RTT source computes its rowtime
 * from it, so only the first three fields of a batch are decoded there; FlowRtts reads the rest
 * in the window.
 *
 * <p>A value that is not a batch gives 0 (1970, never a real batch's time: the job drops rows at
 * it before its windows) and is counted (metric malformed_rtt_batches) and logged with what was
 * wrong; event time must be a number, and one bad record must not stop the job.
 */
public class RttBatchTime extends ScalarFunction {
  private static final long serialVersionUID = 1L;
  static final long MALFORMED = 0;

  private transient RttBatchReader reader;
  private transient Counter malformed;

  @Override
  public void open(FunctionContext context) {
    reader = new RttBatchReader();
    malformed = context.getMetricGroup().counter("malformed_rtt_batches");
  }

  public @DataTypeHint("BIGINT NOT NULL") long eval(byte[] batch) {
    try {
      return Math.floorDiv(reader.readEnd(batch) - 1, 1_000_000L);
    } catch (RttBatchReader.Malformed e) {
      RttBatchReader.count(malformed, e);
      return MALFORMED;
    }
  }
}
