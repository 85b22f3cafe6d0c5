"""Publish one verification-code job to mailgate and print its result."""
import json, os, secrets, sys, uuid
import pika

conn = pika.BlockingConnection(pika.URLParameters(os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")))
ch = conn.channel()
reply_to = ch.queue_declare(queue="", exclusive=True).method.queue  # a private queue for our result
code = f"{secrets.randbelow(10**6):06d}"  # from a CSPRNG; keep it to check what the user types
job = {"id": str(uuid.uuid4()), "email": sys.argv[1], "code": code, "vars": {"app_name": "Acme"}}
ch.confirm_delivery()  # the broker confirms it has the job
# mandatory: with no jobs queue (no worker ever started) the job is returned,
# raising pika.exceptions.UnroutableError, instead of being dropped.
ch.basic_publish("", os.environ.get("JOBS_QUEUE", "mailgate.jobs"), json.dumps(job),
                 pika.BasicProperties(delivery_mode=2, reply_to=reply_to, correlation_id=job["id"]),
                 mandatory=True)
for _, _, body in ch.consume(reply_to, auto_ack=True, inactivity_timeout=30):
    print(body.decode() if body else '{"error": "no result within 30s"}')
    break
conn.close()
