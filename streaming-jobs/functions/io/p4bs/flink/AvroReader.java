package io.p4bs.flink;

import java.nio.charset.StandardCharsets;
import org.apache.flink.metrics.Counter;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What the job's readers of Avro binary values share: a cursor over a Kafka value's bytes and
 * the primitive reads, each checking that the value holds what it reads. Anything else (a value
 * cut short, a length past its end, a number out of its type's range) is a {@link Malformed}
 * with what was wrong: the job counts it and passes over the record, never fails on it.
 */
abstract class AvroReader {
  /** A value that is not the record it should be; the message says why. */
  static final class Malformed extends Exception {
    private static final long serialVersionUID = 1L;

    Malformed(String why) {
      super(why, null, false, false); // no stack trace: bad records are counted, not debugged
    }
  }

  private static final Logger LOG = LoggerFactory.getLogger(AvroReader.class);

  protected byte[] bytes = new byte[0];
  protected int pos;

  /**
   * Counts a dropped record of {@code what} and logs why: the first ten, then every
   * ten-thousandth (a stream of garbage must not flood the log).
   */
  static void count(Counter dropped, String what, Malformed why) {
    dropped.inc();
    long n = dropped.getCount();
    if (n <= 10 || n % 10_000 == 0) {
      LOG.warn("{} dropped ({} so far): {}", what, n, why.getMessage());
    }
  }

  protected void start(byte[] value) throws Malformed {
    if (value == null) {
      throw new Malformed("no value");
    }
    bytes = value;
    pos = 0;
  }

  protected void end() throws Malformed {
    if (pos != bytes.length) {
      throw new Malformed((bytes.length - pos) + " bytes after the last field");
    }
  }

  /**
   * The item count of an array's next block (0 at its end). A negative count is followed by the
   * block's size in bytes (Avro's skippable blocks). Each item takes at least {@code minItemBytes},
   * so a count the rest of the value cannot hold is malformed rather than a huge allocation.
   */
  protected long blockCount(int minItemBytes) throws Malformed {
    long n = readLong();
    if (n < 0) {
      n = -n;
      readLong();
    }
    if (n > (long) (bytes.length - pos) / minItemBytes) {
      throw new Malformed(
          "an array block of " + n + " items at byte " + pos + " of " + bytes.length);
    }
    return n;
  }

  protected long readLong() throws Malformed {
    long z = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= bytes.length) {
        throw new Malformed("value ends inside a number at byte " + pos);
      }
      byte b = bytes[pos++];
      z |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        return (z >>> 1) ^ -(z & 1);
      }
    }
    throw new Malformed("a number longer than 10 bytes at byte " + pos);
  }

  protected int readInt() throws Malformed {
    long v = readLong();
    if (v != (int) v) {
      throw new Malformed("int out of range: " + v);
    }
    return (int) v;
  }

  protected boolean readBoolean(String field) throws Malformed {
    if (pos >= bytes.length || (bytes[pos] & 0xFF) > 1) {
      throw new Malformed(field + " is not a boolean at byte " + pos);
    }
    return bytes[pos++] == 1;
  }

  /** An Avro double: 8 bytes, little-endian. */
  protected double readDouble() throws Malformed {
    if (bytes.length - pos < 8) {
      throw new Malformed("value ends inside a double at byte " + pos);
    }
    long bits = 0;
    for (int i = 7; i >= 0; i--) {
      bits = (bits << 8) | (bytes[pos + i] & 0xFF);
    }
    pos += 8;
    return Double.longBitsToDouble(bits);
  }

  /** Skips a string and returns its length in bytes. */
  protected int readStringLength() throws Malformed {
    long n = readLong();
    if (n < 0 || n > bytes.length - pos) {
      throw new Malformed("a string of " + n + " bytes at byte " + pos + " of " + bytes.length);
    }
    pos += (int) n;
    return (int) n;
  }

  protected String readString() throws Malformed {
    int length = readStringLength();
    return text(pos - length, length);
  }

  protected String text(int start, int length) {
    return new String(bytes, start, length, StandardCharsets.UTF_8);
  }
}
