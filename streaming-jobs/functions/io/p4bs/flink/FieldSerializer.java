package io.p4bs.flink;

import java.io.IOException;
import org.apache.flink.api.common.typeutils.base.TypeSerializerSingleton;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;

/**
 * What the serializers of the project's mutable accumulators share: each writes its type field
 * by field (Flink's generic Kryo serializer cost showed in profiles of the job, at every
 * checkpoint), never reuses an instance and has no fixed length.
 */
public abstract class FieldSerializer<T> extends TypeSerializerSingleton<T> {
  private static final long serialVersionUID = 1L;

  @Override
  public boolean isImmutableType() {
    return false;
  }

  @Override
  public T copy(T from, T reuse) {
    return copy(from);
  }

  @Override
  public int getLength() {
    return -1;
  }

  @Override
  public T deserialize(T reuse, DataInputView source) throws IOException {
    return deserialize(source);
  }

  @Override
  public void copy(DataInputView source, DataOutputView target) throws IOException {
    serialize(deserialize(source), target);
  }
}
