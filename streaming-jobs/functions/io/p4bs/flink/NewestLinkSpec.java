package io.p4bs.flink;

import java.io.IOException;
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
 * A link's newest LinkSpec record in a window (the largest ts_ns; of equal ones the last taken),
 * from the links topic's raw bytes, as a row of checked values (LinkSpecReader.SPEC_TYPE) for
 * LinkMetrics; null for a window without one. Values, not text: nothing in a record can be
 * mistaken for a separator. A null value (a row of another kind) adds nothing; a record that does
 * not pass LinkSpecReader's checks adds nothing and is counted (malformed_link_specs), though the
 * job has dropped those already (LinkSpecTime stamps them 0). The row carries the policy the
 * record's config names (the optimizer feed thins the windows of some policies' links); a config
 * that names none the job can read leaves it null, so the link gets every window, and is counted
 * (link_specs_without_policy) and logged.
 */
@FunctionHint(
    input = {@DataTypeHint("STRING"), @DataTypeHint("BYTES")},
    accumulator =
        @DataTypeHint(
            value = "RAW",
            bridgedTo = NewestLinkSpec.Newest.class,
            rawSerializer = NewestLinkSpec.NewestSerializer.class),
    output = @DataTypeHint(LinkSpecReader.SPEC_TYPE))
public class NewestLinkSpec extends AggregateFunction<Row, NewestLinkSpec.Newest> {
  private static final long serialVersionUID = 1L;

  private transient LinkSpecReader reader;
  private transient Counter malformed;
  private transient Counter withoutPolicy;

  /** The newest spec so far: none while settings is null. */
  public static final class Newest {
    long tsNs = Long.MIN_VALUE;
    boolean removed;
    LinkSettings settings;

    void take(long tsNs, boolean removed, LinkSettings settings) {
      if (tsNs >= this.tsNs) {
        this.tsNs = tsNs;
        this.removed = removed;
        this.settings = settings;
      }
    }
  }

  /** Writes the newest spec field by field (see FieldSerializer). */
  public static final class NewestSerializer extends FieldSerializer<Newest> {
    private static final long serialVersionUID = 1L;
    static final NewestSerializer INSTANCE = new NewestSerializer();

    @Override
    public Newest createInstance() {
      return new Newest();
    }

    @Override
    public Newest copy(Newest from) {
      Newest to = new Newest();
      to.take(from.tsNs, from.removed, from.settings); // settings are immutable
      return to;
    }

    @Override
    public void serialize(Newest newest, DataOutputView target) throws IOException {
      target.writeLong(newest.tsNs);
      target.writeBoolean(newest.removed);
      target.writeBoolean(newest.settings != null);
      if (newest.settings != null) {
        newest.settings.write(target);
      }
    }

    @Override
    public Newest deserialize(DataInputView source) throws IOException {
      Newest newest = new Newest();
      newest.tsNs = source.readLong();
      newest.removed = source.readBoolean();
      newest.settings = source.readBoolean() ? LinkSettings.read(source) : null;
      return newest;
    }

    @Override
    public TypeSerializerSnapshot<Newest> snapshotConfiguration() {
      return new NewestSerializerSnapshot();
    }
  }

  /** The serializer has no configuration: restoring it is creating it. */
  public static final class NewestSerializerSnapshot
      extends SimpleTypeSerializerSnapshot<Newest> {
    public NewestSerializerSnapshot() {
      super(() -> NewestSerializer.INSTANCE);
    }
  }

  @Override
  public void open(FunctionContext context) {
    reader = new LinkSpecReader();
    malformed = JobCounters.counter(context, LinkSpecReader.MALFORMED_METRIC);
    withoutPolicy = JobCounters.counter(context, LinkSpecReader.NO_POLICY_METRIC);
  }

  @Override
  public Newest createAccumulator() {
    return new Newest();
  }

  public void accumulate(Newest acc, String linkId, byte[] value) {
    if (value == null) {
      return;
    }
    try {
      reader.read(linkId, value);
    } catch (AvroReader.Malformed e) {
      AvroReader.count(malformed, LinkSpecReader.WHAT, e);
      return;
    }
    String policy = null;
    if (!reader.removed) {
      try {
        policy = reader.policy();
      } catch (AvroReader.Malformed e) {
        AvroReader.count(withoutPolicy, LinkSpecReader.NO_POLICY_WHAT, e);
      }
    }
    acc.take(reader.tsNs, reader.removed, reader.settings.withPolicy(policy));
  }

  public void merge(Newest acc, Iterable<Newest> others) {
    for (Newest other : others) {
      if (other.settings != null) {
        acc.take(other.tsNs, other.removed, other.settings);
      }
    }
  }

  @Override
  public Row getValue(Newest acc) {
    LinkSettings s = acc.settings;
    return s == null
        ? null
        : Row.of(
            acc.tsNs,
            acc.removed,
            s.capacityBps,
            s.weightLoss,
            s.weightDelay,
            s.maxLoss,
            s.maxQueueDelayNs,
            s.policy);
  }
}
