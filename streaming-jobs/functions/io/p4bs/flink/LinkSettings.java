package io.p4bs.flink;

import java.io.IOException;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;

/**
 * One link's capacity, weights and SLA bounds, from the config or a LinkSpec record of the links
 * topic, checked so that LinkMetrics's divisions are by numbers above 0 and its products of
 * finite numbers: capacity_bps > 0, max_queue_delay_ns > 0, 0 < max_loss <= 1, the weights
 * finite and >= 0; and the optimizer's policy for it (null: not known), which decides whether
 * the optimizer feed thins its windows (OptimizerFeed). Immutable.
 */
final class LinkSettings {
  /** The longest link id ("router:interface") taken. */
  static final int LINK_ID_MAX = 256;

  final long capacityBps, maxQueueDelayNs;
  final double weightLoss, weightDelay, maxLoss;
  final String policy;

  private LinkSettings(
      long capacityBps,
      double weightLoss,
      double weightDelay,
      double maxLoss,
      long maxQueueDelayNs,
      String policy) {
    this.capacityBps = capacityBps;
    this.weightLoss = weightLoss;
    this.weightDelay = weightDelay;
    this.maxLoss = maxLoss;
    this.maxQueueDelayNs = maxQueueDelayNs;
    this.policy = policy;
  }

  /** The settings, or a Malformed naming the first value out of its range. */
  static LinkSettings of(
      long capacityBps,
      double weightLoss,
      double weightDelay,
      double maxLoss,
      long maxQueueDelayNs,
      String policy)
      throws AvroReader.Malformed {
    if (capacityBps <= 0) {
      throw new AvroReader.Malformed("capacity_bps " + capacityBps + " is not above 0");
    }
    if (maxQueueDelayNs <= 0) {
      throw new AvroReader.Malformed("max_queue_delay_ns " + maxQueueDelayNs + " is not above 0");
    }
    if (!(maxLoss > 0 && maxLoss <= 1)) { // NaN fails it too
      throw new AvroReader.Malformed("max_loss " + maxLoss + " is not in (0, 1]");
    }
    if (!Double.isFinite(weightLoss) || weightLoss < 0) {
      throw new AvroReader.Malformed("weight_loss " + weightLoss + " is not a finite number >= 0");
    }
    if (!Double.isFinite(weightDelay) || weightDelay < 0) {
      throw new AvroReader.Malformed(
          "weight_delay " + weightDelay + " is not a finite number >= 0");
    }
    return new LinkSettings(capacityBps, weightLoss, weightDelay, maxLoss, maxQueueDelayNs, policy);
  }

  /** The same settings for a link of another policy (null: not known). */
  LinkSettings withPolicy(String otherPolicy) {
    return new LinkSettings(
        capacityBps, weightLoss, weightDelay, maxLoss, maxQueueDelayNs, otherPolicy);
  }

  /**
   * A link id as the project writes them: "router:interface", both parts non-empty, of letters,
   * digits and "_.:/-" (the interface names of the drivers' syntax), at most LINK_ID_MAX
   * characters. A link id is also an SLA alert's id and a key in the job's state.
   */
  static void checkLinkId(String linkId) throws AvroReader.Malformed {
    if (linkId == null) {
      throw new AvroReader.Malformed("no link id (the record has no key)");
    }
    int colon = linkId.indexOf(':');
    boolean shaped = colon > 0 && colon < linkId.length() - 1 && linkId.length() <= LINK_ID_MAX;
    for (int i = 0; shaped && i < linkId.length(); i++) {
      char c = linkId.charAt(i);
      shaped =
          c >= 'a' && c <= 'z'
              || c >= 'A' && c <= 'Z'
              || c >= '0' && c <= '9'
              || "_.:/-".indexOf(c) >= 0;
    }
    if (!shaped) {
      String shown = linkId.length() > 80 ? linkId.substring(0, 80) + "..." : linkId;
      throw new AvroReader.Malformed(
          "link id '" + shown + "' is not router:interface of letters, digits and _.:/-");
    }
  }

  void write(DataOutputView target) throws IOException {
    target.writeLong(capacityBps);
    target.writeLong(maxQueueDelayNs);
    target.writeDouble(weightLoss);
    target.writeDouble(weightDelay);
    target.writeDouble(maxLoss);
    target.writeBoolean(policy != null);
    if (policy != null) {
      target.writeUTF(policy);
    }
  }

  /** Settings written by {@link #write}: checked when they were taken. */
  static LinkSettings read(DataInputView source) throws IOException {
    long capacityBps = source.readLong();
    long maxQueueDelayNs = source.readLong();
    double weightLoss = source.readDouble();
    double weightDelay = source.readDouble();
    double maxLoss = source.readDouble();
    String policy = source.readBoolean() ? source.readUTF() : null;
    return new LinkSettings(capacityBps, weightLoss, weightDelay, maxLoss, maxQueueDelayNs, policy);
  }
}
