"""The segtxn asyncio client.

```python
async with Client("http://b1:8080,http://b2:8080", operation_timeout_s=30) as client:
    producer = await client.create_producer("topic://acme/orders/events")
    await producer.send(b"hello", key="customer-42")
    consumer = await client.subscribe("topic://acme/orders/events", "billing")
    async for message in consumer:
        await consumer.acknowledge(message)
```
"""

from segtxn.client.checkpoint import CheckpointConsumer
from segtxn.client.client import Client
from segtxn.client.consumer import Consumer
from segtxn.client.errors import (
    CertificateError,
    ClientClosed,
    ClientError,
    ConnectionLost,
    ConsumerBusy,
    ErrorCategory,
    ErrorName,
    InvalidArgument,
    InvalidMessage,
    InvalidTopicName,
    InvalidTxnStatus,
    MessageTooLarge,
    MetadataError,
    MetadataStoreFull,
    NotAllowed,
    NotAuthorized,
    NotOwner,
    OperationCancelled,
    PersistenceError,
    PreconditionFailed,
    ProducerBusy,
    ServerError,
    ServiceNotReady,
    StoreAccessDenied,
    SubscriptionNotFound,
    Timeout,
    TooManyRequests,
    TopicAlreadyExists,
    TopicBusy,
    TopicEnded,
    TopicNotFound,
    TopicTerminatedError,
    TransactionConflict,
    TransactionNotFound,
    Unauthenticated,
    UnknownError,
)
from segtxn.client.messages import Message, MessageId
from segtxn.client.producer import Producer
from segtxn.client.producer_options import ProducerOptions
from segtxn.client.reader import Reader
from segtxn.client.scalable import ScalableProducer
from segtxn.client.transaction import (
    OutcomeUnknown,
    PrecedingNotCommitted,
    Transaction,
    TransactionEnded,
    TransactionFailed,
    TransactionState,
)
from segtxn.protocol.preconditions import PropertyPrecondition
from segtxn.protocol.tokens import SuppliedToken, TokenFile, TokenSource

__all__ = [
    "CertificateError",
    "CheckpointConsumer",
    "Client",
    "ClientClosed",
    "ClientError",
    "ConnectionLost",
    "Consumer",
    "ConsumerBusy",
    "ErrorCategory",
    "ErrorName",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidTxnStatus",
    "Message",
    "MessageId",
    "MessageTooLarge",
    "MetadataError",
    "MetadataStoreFull",
    "NotAllowed",
    "NotAuthorized",
    "NotOwner",
    "OperationCancelled",
    "OutcomeUnknown",
    "PersistenceError",
    "PrecedingNotCommitted",
    "PreconditionFailed",
    "Producer",
    "ProducerBusy",
    "ProducerOptions",
    "PropertyPrecondition",
    "Reader",
    "ScalableProducer",
    "ServerError",
    "ServiceNotReady",
    "StoreAccessDenied",
    "SubscriptionNotFound",
    "SuppliedToken",
    "Timeout",
    "TokenFile",
    "TokenSource",
    "TooManyRequests",
    "TopicAlreadyExists",
    "TopicBusy",
    "TopicEnded",
    "TopicNotFound",
    "TopicTerminatedError",
    "Transaction",
    "TransactionConflict",
    "TransactionEnded",
    "TransactionFailed",
    "TransactionNotFound",
    "TransactionState",
    "Unauthenticated",
    "UnknownError",
]
