package io.p4bs.flink;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.metrics.Counter;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.types.Row;

/**
 * The RTT part of a link's window: reduces the window's RTT sample batches per flow (samples,
 * sum of RTTs, minimum) and returns what the metrics job needs of them. Runs per sample, so it
 * is Java: Flink SQL's UNNEST costs about 15 µs per element here, over 10x this.
 *
 * <p>Input: a batch as the Kafka value's raw bytes (RttSampleBatch, Avro binary), read by
 * {@link RttBatchReader}. A flow's key is built once per batch, for the flows that have samples;
 * the samples themselves are only numbers. A sample whose flow index is not a position in the
 * flows is skipped and counted (metric skipped_rtt_samples); a value that does not decode as a
 * batch, or whose columns differ in length, adds nothing and is counted (malformed_rtt_batches)
 * and logged: a malformed batch must not stop the job. A null batch (a row of another kind) adds
 * nothing.
 *
 * <p>Output: samples = all RTT samples; flows = distinct flows; inverse_sum = the sum over flows
 * of samples / sum of RTTs (1 / the flow's mean RTT, ns); min_ns = the smallest sample (null
 * without samples); flow_keys = the flows as "src:sport>dst:dport/protocol", sorted, comma
 * separated (null without samples).
 */
@FunctionHint(
    input = @DataTypeHint("BYTES"),
    accumulator =
        @DataTypeHint(
            value = "RAW",
            bridgedTo = FlowRtts.Flows.class,
            rawSerializer = FlowRtts.FlowsSerializer.class),
    output =
        @DataTypeHint(
            "ROW<samples BIGINT NOT NULL, flows INT NOT NULL, inverse_sum DOUBLE NOT NULL,"
                + " min_ns BIGINT, flow_keys STRING>"))
public class FlowRtts extends AggregateFunction<Row, FlowRtts.Flows> {
  private static final long serialVersionUID = 1L;
  private static final int COUNT = 0, SUM = 1, MIN = 2;

  private transient Counter skipped;
  private transient Counter malformed;
  private transient RttBatchReader reader;
  /** Per flow of the batch being read: its statistics, looked up on its first sample. */
  private transient long[][] batchFlows;

  /** Per flow key: {samples, sum of RTTs in ns, minimum RTT in ns}. */
  public static final class Flows {
    public final HashMap<String, long[]> byKey = new HashMap<>();

    /** The flow's statistics, created empty (no samples, minimum above any RTT) if new. */
    long[] of(String key) {
      return byKey.computeIfAbsent(key, k -> new long[] {0, 0, Long.MAX_VALUE});
    }
  }

  /**
   * Writes an accumulator as its flow count, then per flow its key and three numbers. Flink
   * serializes accumulators between the two aggregation phases and into every checkpoint, and
   * its generic (Kryo) serializer's string and map handling showed in a profile of the job.
   */
  public static final class FlowsSerializer extends FieldSerializer<Flows> {
    private static final long serialVersionUID = 1L;
    static final FlowsSerializer INSTANCE = new FlowsSerializer();

    @Override
    public Flows createInstance() {
      return new Flows();
    }

    @Override
    public Flows copy(Flows from) {
      Flows to = new Flows();
      for (Map.Entry<String, long[]> e : from.byKey.entrySet()) {
        to.byKey.put(e.getKey(), e.getValue().clone());
      }
      return to;
    }

    @Override
    public void serialize(Flows flows, DataOutputView target) throws IOException {
      target.writeInt(flows.byKey.size());
      for (Map.Entry<String, long[]> e : flows.byKey.entrySet()) {
        target.writeUTF(e.getKey());
        long[] s = e.getValue();
        target.writeLong(s[COUNT]);
        target.writeLong(s[SUM]);
        target.writeLong(s[MIN]);
      }
    }

    @Override
    public Flows deserialize(DataInputView source) throws IOException {
      Flows flows = new Flows();
      for (int n = source.readInt(); n > 0; n--) {
        String key = source.readUTF();
        flows.byKey.put(key, new long[] {source.readLong(), source.readLong(), source.readLong()});
      }
      return flows;
    }

    @Override
    public TypeSerializerSnapshot<Flows> snapshotConfiguration() {
      return new FlowsSerializerSnapshot();
    }
  }

  /** The serializer has no configuration: restoring it is creating it. */
  public static final class FlowsSerializerSnapshot extends SimpleTypeSerializerSnapshot<Flows> {
    public FlowsSerializerSnapshot() {
      super(() -> FlowsSerializer.INSTANCE);
    }
  }

  @Override
  public void open(FunctionContext context) {
    skipped = context.getMetricGroup().counter("skipped_rtt_samples");
    malformed = context.getMetricGroup().counter("malformed_rtt_batches");
    reader = new RttBatchReader();
    batchFlows = new long[16][];
  }

  @Override
  public Flows createAccumulator() {
    return new Flows();
  }

  public void accumulate(Flows acc, byte[] batch) {
    if (batch == null) {
      return;
    }
    try {
      reader.read(batch);
    } catch (RttBatchReader.Malformed e) {
      RttBatchReader.count(malformed, e);
      return;
    }
    if (batchFlows.length < reader.flowCount) {
      batchFlows = new long[reader.flowCount][];
    }
    long[][] stats = batchFlows;
    Arrays.fill(stats, 0, reader.flowCount, null);
    int[] flowIndex = reader.flowIndex;
    long[] rttNs = reader.rttNs;
    for (int i = 0; i < reader.sampleCount; i++) {
      int f = flowIndex[i];
      if (f < 0 || f >= reader.flowCount) {
        skipped.inc();
        continue;
      }
      long[] s = stats[f];
      if (s == null) {
        s = stats[f] = acc.of(reader.flowKey(f));
      }
      long rtt = rttNs[i];
      s[COUNT] += 1;
      s[SUM] += rtt;
      s[MIN] = Math.min(s[MIN], rtt);
    }
  }

  public void merge(Flows acc, Iterable<Flows> others) {
    for (Flows other : others) {
      for (Map.Entry<String, long[]> e : other.byKey.entrySet()) {
        long[] from = e.getValue();
        long[] s = acc.of(e.getKey());
        s[COUNT] += from[COUNT];
        s[SUM] += from[SUM];
        s[MIN] = Math.min(s[MIN], from[MIN]);
      }
    }
  }

  @Override
  public Row getValue(Flows acc) {
    List<String> keys = new ArrayList<>(acc.byKey.keySet());
    Collections.sort(keys);
    long samples = 0;
    double inverseSum = 0.0;
    Long min = null;
    for (String key : keys) {
      long[] s = acc.byKey.get(key);
      samples += s[COUNT];
      inverseSum += (double) s[COUNT] / s[SUM];
      min = min == null ? s[MIN] : Math.min(min, s[MIN]);
    }
    String flowKeys = keys.isEmpty() ? null : String.join(",", keys);
    return Row.of(samples, keys.size(), inverseSum, min, flowKeys);
  }
}
